// Package lifecycle owns which model instance runs where: it opens the
// devices brokerd serves on, places replicas of the built-in encoder and
// of repository models (encoders, MLPs, decoder LLMs with their KV-cache
// engines) on them within each device's memory budget, registers them with
// the scheduler, and loads, reloads and unloads versions without dropping
// a request (a gate per served version counts the requests holding it).
// Each kind of model is a servable (servable.go, generator.go), and one
// placement loop (place.go) places any of them.
//
// The gRPC and HTTP edge (package server) asks a Set what serves a name
// (Acquire/Release around each request, Lookup for metadata) and forwards
// the administration RPCs to Load and Unload; it maps the errors here
// (ErrModelNotFound, ErrModelNotLoaded, ErrBuiltinModel, *AdmissionError)
// to status codes.
package lifecycle
