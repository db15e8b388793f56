//go:build linux || darwin

package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// listen opens the server's port with SO_REUSEPORT, so that a refuse
// window can bind a placeholder beside it (reserve) before it closes.
func listen(addr string) (net.Listener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, unix.SO_REUSEPORT, 1) })
		return errors.Join(err, serr)
	}}
	return lc.Listen(context.Background(), "tcp", addr)
}

// reservation is a socket bound to the server's port that does not
// listen: the kernel refuses every connection to the port (ECONNREFUSED),
// and nothing else can take the port while the window lasts.
type reservation struct{ fd int }

// reserve binds addr without listening, beside the open listener.
func reserve(addr string) (*reservation, error) {
	ta, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		return nil, err
	}
	family, sa := syscall.AF_INET6, syscall.Sockaddr(nil)
	if ip4 := ta.IP.To4(); ip4 != nil || ta.IP == nil {
		a := &syscall.SockaddrInet4{Port: ta.Port}
		copy(a.Addr[:], ip4)
		family, sa = syscall.AF_INET, a
	} else {
		a := &syscall.SockaddrInet6{Port: ta.Port}
		copy(a.Addr[:], ta.IP.To16())
		sa = a
	}
	fd, err := syscall.Socket(family, syscall.SOCK_STREAM, 0)
	if err != nil {
		return nil, fmt.Errorf("reserve %s: %w", addr, err)
	}
	syscall.CloseOnExec(fd)
	for _, opt := range []int{syscall.SO_REUSEADDR, unix.SO_REUSEPORT} {
		if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, opt, 1); err != nil {
			_ = syscall.Close(fd)
			return nil, fmt.Errorf("reserve %s: %w", addr, err)
		}
	}
	if err := syscall.Bind(fd, sa); err != nil {
		_ = syscall.Close(fd)
		return nil, fmt.Errorf("reserve %s: %w", addr, err)
	}
	return &reservation{fd: fd}, nil
}

// listen turns the reservation into the listener: the port opens again
// with no moment in which it is free.
func (r *reservation) listen() (net.Listener, error) {
	if err := syscall.Listen(r.fd, syscall.SOMAXCONN); err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(r.fd), "chaos-listener")
	r.fd = -1
	defer f.Close() // FileListener holds its own copy
	return net.FileListener(f)
}

// Close gives the port up.
func (r *reservation) Close() error {
	if r.fd < 0 {
		return nil
	}
	err := syscall.Close(r.fd)
	r.fd = -1
	return err
}
