package digest

import (
	"slices"
	"strings"
	"testing"

	"github.com/failbus/failbus/pkg/events"
)

func codesOf(v *View) []string {
	var out []string
	for _, c := range v.Codes[:v.NCodes] {
		out = append(out, string(v.CodeBuf[c.Lo:c.Hi]))
	}
	return out
}

func view(status int, body, transport string) *View {
	v := &View{}
	v.Reset(&events.Outcome{Status: status, Body: body, TransportError: transport})
	return v
}

// TestExtract: the error's own code, type and message come out of every
// body shape the corpus holds; the rules match what comes out.
func TestExtract(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name        string
		status      int
		body, trans string
		codes       []string // each must be among the codes
		text        []string // each must be in the error text
		notText     []string // none may be in the error text
		words       []string // each must be in the identifier words
		bodyError   bool
		html        bool // an HTML page, its title found
	}{
		{name: "nested JSON, numeric code", status: 429,
			body:  `{"error":{"code":1113,"message":"您的账户已欠费，请充值后重试。"}}`,
			codes: []string{"1113"}, text: []string{"欠费"}, bodyError: true},
		{name: "other key spellings", status: 400,
			body:  `{"error_code":336103,"error_msg":"prompt tokens too long","ErrorType":"InvalidParameter"}`,
			codes: []string{"336103", "invalidparameter"}, text: []string{"prompt tokens too long"}},
		{name: "MiniMax base_resp", status: 200,
			body:  `{"id":"x","base_resp":{"status_code":1008,"status_msg":"insufficient balance"}}`,
			codes: []string{"1008"}, text: []string{"insufficient balance"}},
		{name: "Python dict an SDK printed", status: 403,
			body:  `Error code: 403 - {'code': 30011, 'message': 'Your paid balance is insufficient.', 'data': None}`,
			codes: []string{"30011"}, text: []string{"paid balance is insufficient"}},
		{name: "JavaScript object with unquoted keys", status: 0,
			body:  `{ error: { code: 'ECONNRESET', message: 'socket hang up' } }`,
			codes: []string{"econnreset"}, text: []string{"socket hang up"}},
		{name: "last error event of an SSE stream", status: 200,
			body:  "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\nevent: error\ndata: {\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n",
			codes: []string{"overloaded_error"}, text: []string{"overloaded"}, notText: []string{"hi"}, bodyError: true},
		{name: "HTML proxy page", status: 502, html: true,
			body: "<html><head><title>502 Bad Gateway</title></head><body><center><h1>502 Bad Gateway</h1></center><hr><center>nginx</center></body></html>"},
		{name: "code in angle brackets is no HTML", status: 400,
			body:  "<400> InternalError.Algo.InvalidParameter: Range of input length should be [1, 30720]",
			codes: []string{"internalerror.algo.invalidparameter"}, text: []string{"range of input length"}},
		{name: "bracketed numeric code", status: 400,
			body:  "[1301][系统检测到输入或生成内容可能包含不安全或敏感内容]",
			codes: []string{"1301"}, text: []string{"敏感"}},
		{name: "key: value log line", status: 400,
			body:  "sync_call Failed, status_code: 400, code: Arrearage, message: Access denied, please make sure your account is in good standing.",
			codes: []string{"arrearage"}, text: []string{"good standing"}},
		{name: "error name gives its words", status: 403,
			body:  `{"error":{"code":"AccountOverdueError","message":"The request failed because your account has an overdue balance."}}`,
			codes: []string{"accountoverdueerror"}, words: []string{"account overdue error"}},
		{name: "snake_case code gives its words", status: 429,
			body:  `{"error":{"type":"exceeded_current_quota_error","message":"Your account is suspended"}}`,
			codes: []string{"exceeded_current_quota_error"}, words: []string{"exceeded current quota error"}},
		{name: "white space folded", status: 400,
			body: "{\"error\":{\"message\":\"This model's   maximum\\n context length is 4096 tokens\"}}",
			text: []string{"this model's maximum context length is 4096 tokens"}},
		{name: "transport text when no body", status: 0, trans: "Error: socket hang up\n    at TLSSocket.onConnectEnd",
			text: []string{"socket hang up"}},
		{name: "error object inside a transport error", status: 0,
			trans: `received error while streaming: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`,
			codes: []string{"overloaded_error"}, bodyError: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			v := view(tt.status, tt.body, tt.trans)
			codes := codesOf(v)
			for _, c := range tt.codes {
				if !slices.Contains(codes, c) {
					t.Errorf("codes %q lack %q", codes, c)
				}
			}
			text := string(v.Text)
			for _, s := range tt.text {
				if !strings.Contains(text, s) {
					t.Errorf("text %q lacks %q", text, s)
				}
			}
			for _, s := range tt.notText {
				if strings.Contains(text, s) {
					t.Errorf("text %q holds %q", text, s)
				}
			}
			for _, w := range tt.words {
				if !strings.Contains(string(v.Words), w) {
					t.Errorf("words %q lack %q", v.Words, w)
				}
			}
			if tt.html != v.HTML || tt.html && v.TitleHi <= v.TitleLo {
				t.Errorf("HTML %v title [%d,%d), want HTML %v with a title", v.HTML, v.TitleLo, v.TitleHi, tt.html)
			}
			if tt.bodyError && !v.BodyError {
				t.Error("no error object found")
			}
		})
	}
}

// TestExtractSuccessCodes: a success code beside the data ("code": 0,
// "status": "success") is no error code.
func TestExtractSuccessCodes(t *testing.T) {
	t.Parallel()
	v := view(200, `{"code":0,"msg":"success","data":{"choices":[{"message":{"content":"hello"}}]}}`, "")
	if codes := codesOf(v); slices.Contains(codes, "0") || slices.Contains(codes, "success") {
		t.Fatalf("codes %q hold a success code", codes)
	}
	if v.BodyError {
		t.Fatal("a success body read as an error object")
	}
}

// TestSqueeze: lower-casing folds every run of white space to one space,
// across the join with the text before.
func TestSqueeze(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ before, add, want string }{
		{"", "A  B\n\tC", "a b c"},
		{"", "no runs Here", "no runs here"},
		{"x ", " Y", "x y"},
		{"x\n", "  Y  ", "x\ny "},
		{"x", " Y", "x y"},
		{"", "  ", " "},
		{"", "", ""},
	} {
		got := string(appendLowerText([]byte(tt.before), tt.add))
		if got != tt.want {
			t.Errorf("%q + %q = %q, want %q", tt.before, tt.add, got, tt.want)
		}
	}
}
