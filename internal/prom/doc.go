// Package prom holds the Prometheus helpers failbus's services share:
// registering a collector once in a registry several services use, and
// capping the values of a label that input controls.
package prom
