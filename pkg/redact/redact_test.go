package redact

import (
	"strings"
	"testing"
)

func TestRedact(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, in, want string }{
		{"openai project key echoed by the API",
			"Incorrect API key provided: sk-proj-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789. You can find your API key at https://platform.openai.com/account/api-keys.",
			"Incorrect API key provided: sk-proj-***. You can find your API key at https://platform.openai.com/account/api-keys."},
		{"anthropic key", "x-api-key: sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWx-yz_0123456789", "x-api-key: ***"},
		{"anthropic key in text", "using key sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWx-yz_0123456789 now", "using key sk-ant-*** now"},
		{"google key in URL query", "POST https://generativelanguage.googleapis.com/v1beta/models/gemini:generateContent?key=AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUvW&alt=sse",
			"POST https://generativelanguage.googleapis.com/v1beta/models/gemini:generateContent?key=***&alt=sse"},
		{"bare google key", "key AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUvW leaked", "key AIza*** leaked"},
		{"bearer token", "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjMifQ.c2lnbmF0dXJl", "Authorization: Bearer ***"},
		{"json api_key", `{"api_key": "gsk_0123456789abcdefABCDEF", "model": "llama"}`, `{"api_key": "***", "model": "llama"}`},
		{"aws signature in presigned URL", "https://s3.amazonaws.com/b/k?X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20260302&X-Amz-Signature=abcdef0123456789",
			"https://s3.amazonaws.com/b/k?X-Amz-Credential=***&X-Amz-Signature=***"},
		{"openrouter key", "sk-or-v1-0123456789abcdef0123456789abcdef", "sk-or-***"},
		{"plain text untouched", "Rate limit reached for gpt-4o on tokens per min (TPM): Limit 30000. max_tokens: 4096",
			"Rate limit reached for gpt-4o on tokens per min (TPM): Limit 30000. max_tokens: 4096"},
		{"short words are not keys", "sk-learn and task-key: 42", "sk-learn and task-key: 42"},
		{"already masked stays", "Authorization: Bearer ***", "Authorization: Bearer ***"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := String(tt.in); got != tt.want {
				t.Fatalf("String(%q)\n got %q\nwant %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestRedactDoesNotAllocateOnCleanText(t *testing.T) {
	s := "The model is overloaded. Please try again later."
	if n := testing.AllocsPerRun(100, func() { _ = String(s) }); n != 0 {
		t.Fatalf("Redact allocated %v times on clean text", n)
	}
}

// FuzzRedact: Redact never panics, never grows a secret back, and is
// idempotent.
func FuzzRedact(f *testing.F) {
	f.Add("Incorrect API key provided: sk-proj-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789.")
	f.Add("?key=AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUvW&x=1")
	f.Add("Authorization: Bearer abcdefghijkl")
	f.Add(`{"access_token":"ya29.a0AfH6SMBx"}`)
	f.Fuzz(func(t *testing.T, s string) {
		r := String(s)
		if String(r) != r {
			t.Fatalf("not idempotent: %q -> %q -> %q", s, r, String(r))
		}
		const secret = "sk-ant-api03-SECRETSECRETSECRET"
		if strings.Contains(String(s+" "+secret), secret) {
			t.Fatalf("secret survived after %q", s)
		}
	})
}
