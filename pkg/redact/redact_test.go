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
		{"URL credentials", "fetch https://user:hunter2pass@api.example.com/v1 failed", "fetch https://user:***@api.example.com/v1 failed"},
		{"database URL", "dial postgres://svc:S3cr3t-PASS@db.internal:5432/app?sslmode=require: refused",
			"dial postgres://svc:***@db.internal:5432/app?sslmode=require: refused"},
		{"password with an @", "redis://default:p@ss@cache:6379", "redis://default:***@cache:6379"},
		{"empty user", "redis://:hunter2pass@cache:6379/0", "redis://:***@cache:6379/0"},
		{"quoted URL in JSON", `{"url":"amqp://guest:guestpass@mq/vhost"}`, `{"url":"amqp://guest:***@mq/vhost"}`},
		{"scheme with a plus", "postgresql+psycopg2://svc:S3cr3tPASS@db/app", "postgresql+psycopg2://svc:***@db/app"},
		{"a user alone stays", "git clone ssh://git@github.com/org/repo", "git clone ssh://git@github.com/org/repo"},
		{"a port is no password", "connect http://proxy.internal:3128 refused; mail a@b.c", "connect http://proxy.internal:3128 refused; mail a@b.c"},
		{"a quoted name in prose", `invalid notification: field "dedupe_key": required; field "key": required`,
			`invalid notification: field "dedupe_key": required; field "key": required`},
		{"a JSON secret is quoted", `{"client_secret": "abcd1234efgh", "refresh_token":"r1-xyz789"}`, `{"client_secret": "***", "refresh_token":"***"}`},
		{"token as the user name", "https://ghp_0123456789abcdefABCDEF0123@github.com/org/repo", "https://ghp_***@github.com/org/repo"},
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
	f.Add("postgres://svc:S3cr3t-PASS@db:5432/app")
	f.Fuzz(func(t *testing.T, s string) {
		r := String(s)
		if String(r) != r {
			t.Fatalf("not idempotent: %q -> %q -> %q", s, r, String(r))
		}
		const secret = "sk-ant-api03-SECRETSECRETSECRET"
		if strings.Contains(String(s+" "+secret), secret) {
			t.Fatalf("secret survived after %q", s)
		}
		if strings.Contains(String(s+" https://u:PASSWORDPASSWORD@h/"), "PASSWORDPASSWORD") {
			t.Fatalf("URL password survived after %q", s)
		}
	})
}
