# brokerd — build, run and test. `make run` and `make test` are the two commands
# a fresh Debian 12 machine with Go needs; `make deps` installs the C libraries.

GO        ?= go
BIN       := bin
PKGS      := ./...
RUN_FLAGS ?= --log-format console --state-dir $(CURDIR)/.cache/state
# buf is pinned in tools/go.mod; protoc-gen-go and protoc-gen-go-grpc in go.mod.
BUF       := $(GO) tool -modfile=tools/go.mod buf

# C libraries the cgo runtime adapters link against (Debian package names).
DEB_DEPS  := libdnnl-dev gcc
# NVML's headers mark old calls deprecated; go-nvml still binds them.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)

.PHONY: all build run test test-short bench lint proto proto-check deps clean

all: build

## deps: install the Debian packages the build needs (as root, when missing)
deps:
	@missing=""; for p in $(DEB_DEPS); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q $$missing; \
	fi

## build: brokerd and brokerctl into bin/
build: deps
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o $(BIN)/ ./cmd/brokerd ./cmd/brokerctl

## run: start brokerd in the foreground on this host (CPU), ready for bin/brokerctl
run: build
	$(BIN)/brokerd $(RUN_FLAGS)

## test: lint, check the generated code, and run every test with the race detector
test: deps lint proto-check
	$(GO) test -race -count=1 -timeout 20m $(PKGS)

## test-short: the tests alone, without lint and proto-check
test-short: deps
	$(GO) test -race -count=1 $(PKGS)

## bench: the Go benchmarks (results and commands are recorded in bench/RESULTS.md)
bench: deps
	$(GO) test -run '^$$' -bench . -benchmem -count=1 $(PKGS)

## lint: gofmt and go vet
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(BUF) lint

## proto: regenerate the Go code next to the .proto files
proto:
	$(BUF) generate

## proto-check: fail when the committed generated code is stale
proto-check:
	@tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; \
	$(BUF) generate --output $$tmp && \
	for f in $$(cd $$tmp && find . -name '*.go'); do \
	  cmp -s $$tmp/$$f $$f || { echo "stale generated code: $$f (run make proto)"; exit 1; }; \
	done; \
	for f in $$(find proto -name '*.pb.go'); do \
	  [ -f $$tmp/$$f ] || { echo "generated file without a source: $$f"; exit 1; }; \
	done; echo "generated code is up to date"

clean:
	rm -rf $(BIN) .cache
