//go:build !(linux || darwin)

package chaos

import "net"

// listen opens the server's port.
func listen(addr string) (net.Listener, error) { return net.Listen("tcp", addr) }

// reservation, on this platform, holds nothing: the port is closed for
// the window and opened again after it, and something else could take it
// meanwhile.
type reservation struct{ addr string }

func reserve(addr string) (*reservation, error) { return &reservation{addr: addr}, nil }

func (r *reservation) listen() (net.Listener, error) { return net.Listen("tcp", r.addr) }

func (r *reservation) Close() error { return nil }
