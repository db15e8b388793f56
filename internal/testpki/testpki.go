// Package testpki makes a throw-away certificate authority for tests: a CA,
// a server certificate for 127.0.0.1 and localhost, and a client
// certificate, as PEM files in a test's temp dir, the way docs/DEPLOY.md
// asks an operator to lay them out for nats-server and failbus.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// PKI is the CA and certificates, with the paths of their PEM files.
type PKI struct {
	// Pool trusts the CA.
	Pool *x509.CertPool
	// CAFile is the CA certificate (--tls-ca, nats-server's ca_file).
	CAFile string
	// Server is the server's certificate and key, for an in-process
	// server's tls.Config; ServerCertFile and ServerKeyFile are the same
	// as files (nats-server's cert_file and key_file).
	Server                        tls.Certificate
	ServerCertFile, ServerKeyFile string
	// ClientCertFile and ClientKeyFile are a client certificate
	// (--tls-cert, --tls-key) signed by the CA.
	ClientCertFile, ClientKeyFile string
}

// New writes ca.pem, server.pem, server-key.pem, client.pem and
// client-key.pem into dir (t.TempDir() when empty), valid for an hour.
func New(t testing.TB, dir string) PKI {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "failbus test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	p := PKI{Pool: x509.NewCertPool(), CAFile: filepath.Join(dir, "ca.pem")}
	p.Pool.AddCert(ca)
	writePEM(t, p.CAFile, "CERTIFICATE", caDER)
	leaf := func(serial int64, usage []x509.ExtKeyUsage, certFile, keyFile string) tls.Certificate {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "failbus"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			ExtKeyUsage: usage, KeyUsage: x509.KeyUsageDigitalSignature,
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		writePEM(t, certFile, "CERTIFICATE", der)
		writePEM(t, keyFile, "EC PRIVATE KEY", kder)
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	}
	p.ServerCertFile, p.ServerKeyFile = filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	// serverAuth and clientAuth, as docs/DEPLOY.md's openssl recipe makes
	// it: a node presents it to clients and, dialing a route, to the
	// other nodes.
	p.Server = leaf(2, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, p.ServerCertFile, p.ServerKeyFile)
	p.ClientCertFile, p.ClientKeyFile = filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	leaf(3, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, p.ClientCertFile, p.ClientKeyFile)
	return p
}

func writePEM(t testing.TB, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
