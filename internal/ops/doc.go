// Package ops runs a failbus process's parts together and serves the
// operations endpoints every service exposes (/metrics, /healthz).
package ops
