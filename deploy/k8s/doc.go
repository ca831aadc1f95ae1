// Package k8s holds brokerd's Kubernetes manifests (a kustomize base and the
// cpu, gpu and tpu overlays) and the tests that render and check them.
package k8s
