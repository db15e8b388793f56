package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestCLIDispatch(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		args       []string
		code       int
		out, error string
	}{
		{"no command prints usage", nil, 2, "", "Usage: failbus <command>"},
		{"help lists every command", []string{"help"}, 0, "publish", ""},
		{"help of one command shows its flags", []string{"help", "tail"}, 0, "", "-last"},
		{"an unknown command", []string{"nope"}, 2, "", `unknown command "nope"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(tt.args, nil, &stdout, &stderr); code != tt.code {
				t.Errorf("exit %d, want %d", code, tt.code)
			}
			if !strings.Contains(stdout.String(), tt.out) || !strings.Contains(stderr.String(), tt.error) {
				t.Errorf("stdout %q, stderr %q; want %q and %q", stdout.String(), stderr.String(), tt.out, tt.error)
			}
		})
	}
	for _, c := range commands {
		if c.run == nil || c.summary == "" {
			t.Errorf("command %s is incomplete", c.name)
		}
	}
}
