// Package deploy holds brokerd's deployment material (container image,
// systemd unit, Kubernetes manifests, Compute Engine scripts, Cloud Build,
// Grafana dashboard) and the tests that check it against the real brokerd.
package deploy
