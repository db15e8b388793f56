package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/failbus/failbus/internal/cli"
)

func run(args []string, stdout, stderr *bytes.Buffer) int {
	return cli.Main(commands, args, nil, stdout, stderr)
}

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
		{"help of one command shows its flags on stdout, like help", []string{"help", "tail"}, 0, "-last", ""},
		{"-h of one command shows its flags on stderr", []string{"tail", "-h"}, 0, "", "-last"},
		{"an unknown command", []string{"nope"}, 2, "", `unknown command "nope"`},
		{"help of an unknown command says so", []string{"help", "nope"}, 2, "", `unknown command "nope"`},
		{"version names the Go and nats-server versions", []string{"version"}, 0, "nats-server: v2.", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(tt.args, &stdout, &stderr); code != tt.code {
				t.Errorf("exit %d, want %d", code, tt.code)
			}
			if !strings.Contains(stdout.String(), tt.out) || !strings.Contains(stderr.String(), tt.error) ||
				tt.out == "" && stdout.Len() > 0 || tt.error == "" && stderr.Len() > 0 {
				t.Errorf("stdout %q, stderr %q; want %q and %q", stdout.String(), stderr.String(), tt.out, tt.error)
			}
		})
	}
	seen := map[string]bool{}
	for _, c := range commands {
		if c.Name == "" || c.Run == nil || c.Summary == "" {
			t.Errorf("command %q is incomplete", c.Name)
		}
		if seen[c.Name] {
			t.Errorf("command %q listed twice", c.Name)
		}
		seen[c.Name] = true
	}
}

// TestHelpNamesEachFlagsArgumentInOneWord: the flag package takes text in
// backquotes in a flag's usage for the name of its argument, so a usage
// quoting a command (`failbus auth init`) printed "-nkey failbus auth
// init"; every flag line of every command's help names one argument at
// most.
func TestHelpNamesEachFlagsArgumentInOneWord(t *testing.T) {
	t.Parallel()
	for _, c := range commands {
		var stdout, stderr bytes.Buffer
		if code := run([]string{"help", c.Name}, &stdout, &stderr); code != 0 {
			t.Errorf("help %s: exit %d: %s", c.Name, code, stderr.String())
			continue
		}
		for _, line := range strings.Split(stdout.String(), "\n") {
			if !strings.HasPrefix(line, "  -") {
				continue
			}
			if f := strings.Fields(line); len(f) > 2 {
				t.Errorf("help %s: %q names its argument %q", c.Name, line, strings.Join(f[1:], " "))
			}
		}
	}
}
