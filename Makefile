# brokerd — build, run and test. `make run` and `make test` are the two commands
# a fresh Debian 12 machine with Go needs; `make deps` installs the C libraries.

GO        ?= go
BIN       := bin
PKGS      := ./...
RUN_FLAGS ?= --log-format console --state-dir $(CURDIR)/.cache/state
# buf is pinned in tools/go.mod; protoc-gen-go and protoc-gen-go-grpc in go.mod.
BUF       := $(GO) tool -modfile=tools/go.mod buf

# C libraries the cgo runtime adapters link against (Debian package names);
# shellcheck lints deploy/'s scripts in the tests; python3-zstandard decodes
# LOSSLESS codes the way Python clients do, in the interop tests. Node.js
# (when no node is installed) runs the official ollama and openai clients
# against the HTTP APIs.
DEB_DEPS  := libdnnl-dev gcc shellcheck python3-zstandard
# NVML's headers mark old calls deprecated; go-nvml still binds them.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
# How long make fuzz runs each fuzz target, and make test's short pass.
FUZZTIME       ?= 30s
FUZZTIME_SHORT ?= 3s

# make install / uninstall layout; DESTDIR stages the files into a tree.
PREFIX     ?= /usr/local
BINDIR     ?= $(PREFIX)/bin
SYSCONFDIR ?= /etc
UNITDIR    ?= /etc/systemd/system
# make image: the tag to build (push it with `docker push $(IMAGE)`).
IMAGE      ?= brokerd:$(VERSION)
DOCKER     ?= docker

.PHONY: all build run models test test-short fuzz bench lint proto proto-check deps clean install uninstall image

all: build

## deps: install the Debian packages the build needs (as root, when missing)
deps:
	@missing=""; for p in $(DEB_DEPS); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	command -v node >/dev/null 2>&1 || missing="$$missing nodejs npm"; \
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

## models: write the first models to try (random weights) into make run's model repository
models:
	$(GO) run ./bench/mkmodels -repo $(CURDIR)/.cache/state/models

## test: lint, check the generated code, run every test with the race detector, and each fuzz target briefly
test: deps lint proto-check
	$(GO) test -race -count=1 -timeout 20m $(PKGS)
	FUZZTIME=$(FUZZTIME_SHORT) GO=$(GO) tools/fuzz.sh

## fuzz: every fuzz target of the repository for FUZZTIME each (default 30s)
fuzz: deps
	FUZZTIME=$(FUZZTIME) GO=$(GO) tools/fuzz.sh

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

## install: binaries, the systemd unit and a default config (PREFIX, DESTDIR)
install: build
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSCONFDIR)/brokerd
	install -m 0755 $(BIN)/brokerd $(BIN)/brokerctl $(DESTDIR)$(BINDIR)/
	sed -e 's|/usr/local/bin/brokerd|$(BINDIR)/brokerd|' -e 's|/etc/brokerd/|$(SYSCONFDIR)/brokerd/|' \
	  deploy/systemd/brokerd.service > $(DESTDIR)$(UNITDIR)/brokerd.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/brokerd.service
	@# An existing config may hold the admin's edits: only a missing one is installed.
	@if [ -e $(DESTDIR)$(SYSCONFDIR)/brokerd/brokerd.yaml ]; then \
	  echo "keeping $(DESTDIR)$(SYSCONFDIR)/brokerd/brokerd.yaml"; \
	else install -m 0644 deploy/brokerd.yaml $(DESTDIR)$(SYSCONFDIR)/brokerd/brokerd.yaml; fi
	@# The user and group exist on the target system only: not when staging.
	@if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ]; then \
	  getent group brokerd >/dev/null || groupadd --system brokerd; \
	  getent passwd brokerd >/dev/null || useradd --system --gid brokerd --home-dir /var/lib/brokerd \
	    --no-create-home --shell /usr/sbin/nologin brokerd; \
	fi
	@if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]; then systemctl daemon-reload; fi
	@echo "installed; next: systemctl enable --now brokerd, and usermod -aG brokerd USER for each client user"

## uninstall: remove what install put in place; an edited config, the state dir and the user stay
uninstall:
	@if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]; then systemctl disable --now brokerd.service 2>/dev/null || true; fi
	rm -f $(DESTDIR)$(BINDIR)/brokerd $(DESTDIR)$(BINDIR)/brokerctl $(DESTDIR)$(UNITDIR)/brokerd.service
	@if cmp -s deploy/brokerd.yaml $(DESTDIR)$(SYSCONFDIR)/brokerd/brokerd.yaml; then \
	  rm -f $(DESTDIR)$(SYSCONFDIR)/brokerd/brokerd.yaml; rmdir $(DESTDIR)$(SYSCONFDIR)/brokerd 2>/dev/null || true; \
	elif [ -e $(DESTDIR)$(SYSCONFDIR)/brokerd/brokerd.yaml ]; then \
	  echo "keeping edited $(DESTDIR)$(SYSCONFDIR)/brokerd/brokerd.yaml"; \
	fi
	@if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]; then systemctl daemon-reload; fi

## image: build the container image from deploy/Dockerfile as $(IMAGE) (needs a Docker engine)
image:
	$(DOCKER) build -f deploy/Dockerfile --build-arg VERSION=$(VERSION) -t $(IMAGE) .

clean:
	rm -rf $(BIN) .cache
