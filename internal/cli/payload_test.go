package cli

import "testing"

func TestPayloadJSON(t *testing.T) {
	tests := []struct {
		name, as, out string
		data          []byte
	}{
		{"a msgpack map", PayloadMsgpack, `{"a":1}`, []byte{0x81, 0xa1, 'a', 0x01}},
		{"text that is not msgpack", PayloadText, `"this is not msgpack"`, []byte("this is not msgpack")},
		{"bytes that are neither", PayloadBase64, `"wf8="`, []byte{0xc1, 0xff}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, as := PayloadJSON(tc.data)
			if as != tc.as || string(out) != tc.out {
				t.Errorf("PayloadJSON = %s as %s, want %s as %s", out, as, tc.out, tc.as)
			}
		})
	}
}
