package realsvc

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// layout changes whenever the generated modules change shape, so that
// older cached builds are not reused.
const layout = "realsvc-1"

// Self is this checkout's module path.
const Self = "github.com/memctl/memctl"

//go:embed testdata
var added embed.FS

// DefaultCache is the cache directory: REALSVC_CACHE, or realsvc-cache
// under os.TempDir().
func DefaultCache() string {
	if c := os.Getenv("REALSVC_CACHE"); c != "" {
		return c
	}
	return filepath.Join(os.TempDir(), "realsvc-cache")
}

// Module is one module resolved through the module proxy.
type Module struct {
	Path string
	// Want is the pinned version, Version the one fetched: Want, or the
	// nearest served patch version of the same minor when Want is not
	// served (Note then says so).
	Want, Version string
	// Dir is the module's source in the module cache (read-only).
	Dir  string
	Note string
}

// Resolve fetches path@want with `go mod download`; when that fails it
// lists the served versions once and fetches the nearest patch version of
// the same major and minor. The error says what failed.
func Resolve(path, want string) (Module, error) {
	m := Module{Path: path, Want: want, Version: want}
	dir, err := download(path, want)
	if err == nil {
		m.Dir = dir
		return m, nil
	}
	out, lerr := goOutput("", nil, "list", "-m", "-versions", path)
	if lerr != nil {
		return m, fmt.Errorf("realsvc: %s@%s: %v; listing versions: %v", path, want, err, lerr)
	}
	v, ok := NearestPatch(want, strings.Fields(out)[1:])
	if !ok {
		return m, fmt.Errorf("realsvc: %s@%s: %v; no other patch version of it is served", path, want, err)
	}
	if m.Dir, err = download(path, v); err != nil {
		return m, fmt.Errorf("realsvc: %s@%s (nearest to %s): %v", path, v, want, err)
	}
	m.Version = v
	m.Note = fmt.Sprintf("%s@%s is not served by the module proxy; using the nearest served patch version %s", path, want, v)
	return m, nil
}

func download(path, version string) (string, error) {
	out, err := goOutput("", nil, "mod", "download", "-json", path+"@"+version)
	var d struct{ Dir, Error string }
	if jerr := json.Unmarshal([]byte(out), &d); jerr == nil && d.Error != "" {
		return "", errors.New(d.Error)
	}
	if err != nil {
		return "", err
	}
	if d.Dir == "" {
		return "", fmt.Errorf("go mod download %s@%s: no directory", path, version)
	}
	return d.Dir, nil
}

// NearestPatch returns the version in served of the same major and minor
// as want whose patch number is closest to want's (the higher one on a
// tie), ignoring pre-releases; false when there is none.
func NearestPatch(want string, served []string) (string, bool) {
	wmaj, wmin, wpatch, ok := semver(want)
	if !ok {
		return "", false
	}
	best, bestDist := "", -1
	for _, v := range served {
		maj, mnr, patch, ok := semver(v)
		if !ok || maj != wmaj || mnr != wmin {
			continue
		}
		d := max(patch-wpatch, wpatch-patch)
		if bestDist < 0 || d < bestDist || (d == bestDist && patch > wpatch) {
			best, bestDist = v, d
		}
	}
	return best, bestDist >= 0
}

// semver parses vMAJOR.MINOR.PATCH; false for anything else (pre-releases
// included).
func semver(v string) (maj, mnr, patch int, ok bool) {
	parts := strings.Split(strings.TrimPrefix(v, "v"), ".")
	if len(parts) != 3 || !strings.HasPrefix(v, "v") {
		return 0, 0, 0, false
	}
	var n [3]int
	for i, p := range parts {
		x, err := strconv.Atoi(p)
		if err != nil || x < 0 {
			return 0, 0, 0, false
		}
		n[i] = x
	}
	return n[0], n[1], n[2], true
}

// Checkout returns the root directory of the module of the current
// directory (this checkout when run from its tests).
func Checkout() (string, error) {
	out, err := goOutput("", nil, "list", "-m", "-f", "{{.Dir}}")
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(out), nil
}

// SourceHash hashes what the builds compile from the checkout at root:
// its go.mod and go.sum, and every Go, C, assembly and embedded file of
// the packages in the checkout's module that pkgs import (themselves
// included), by path and content.
func SourceHash(root string, pkgs ...string) (string, error) {
	args := append([]string{"list", "-deps", "-f",
		`{{if .Module}}{{if eq .Module.Path "` + Self + `"}}{{.Dir}}|{{join .GoFiles ","}},{{join .CgoFiles ","}},{{join .CFiles ","}},{{join .HFiles ","}},{{join .SFiles ","}},{{join .EmbedFiles ","}}{{end}}{{end}}`},
		pkgs...)
	out, err := goOutput(root, nil, args...)
	if err != nil {
		return "", err
	}
	var files []string
	for _, line := range strings.Split(out, "\n") {
		dir, list, ok := strings.Cut(line, "|")
		if !ok {
			continue
		}
		for _, f := range strings.Split(list, ",") {
			if f != "" {
				files = append(files, filepath.Join(dir, f))
			}
		}
	}
	if len(files) == 0 {
		return "", fmt.Errorf("realsvc: go list found no file of %s in %v", Self, pkgs)
	}
	files = append(files, filepath.Join(root, "go.mod"), filepath.Join(root, "go.sum"))
	slices.Sort(files)
	h := sha256.New()
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", fmt.Errorf("realsvc: %w", err)
		}
		rel, _ := filepath.Rel(root, f)
		fmt.Fprintf(h, "%s %d\n", rel, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Builds are the binaries of one cached build. Every path is absolute.
type Builds struct {
	Dir string // the key's directory in the cache
	// Pushgateway: the plain service, with the auto import, and with
	// memctl.Start and the budget middleware around the push handler.
	PushgatewayPlain, PushgatewayAuto, PushgatewayBudget string
	// Etcd: the plain etcd main package and the same with the auto import;
	// EtcdLoad is the client program that writes and reads the data.
	EtcdPlain, EtcdAuto, EtcdLoad string
	// Memctl is cmd/memctl of the checkout.
	Memctl string
	// Cached is true when the binaries were already in the cache.
	Cached bool
}

// Versions of the services, as Resolve returned them.
type Versions struct {
	Pushgateway, Etcd Module
}

// Key is the cache key of a build: the layout, the Go version, the
// services' versions, the added files and the checkout's source hash.
func Key(goVersion string, v Versions, srcHash string) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%s@%s\n%s@%s\n%s\n", layout, goVersion, v.Pushgateway.Path, v.Pushgateway.Version, v.Etcd.Path, v.Etcd.Version, srcHash)
	err := fs.WalkDir(added, "testdata", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := added.ReadFile(p)
		fmt.Fprintf(h, "%s %d\n", p, len(b))
		h.Write(b)
		return err
	})
	return hex.EncodeToString(h.Sum(nil))[:16], err
}

// Build returns the builds for key in cache, building them first when they
// are not there: into a fresh directory renamed into place when done, so
// that a failed or concurrent build leaves nothing half made. root is the
// checkout; logf reports each step.
func Build(cache, key, root string, v Versions, logf func(string, ...any)) (Builds, error) {
	dir := filepath.Join(cache, "build", key)
	b := builds(dir)
	defer prune(filepath.Join(cache, "build"), keepBuilds)
	if _, err := os.Stat(filepath.Join(dir, "done")); err == nil {
		b.Cached = true
		now := time.Now()
		_ = os.Chtimes(filepath.Join(dir, "done"), now, now) // used: kept by prune
		return b, nil
	}
	if err := os.MkdirAll(filepath.Join(cache, "build"), 0o755); err != nil {
		return b, fmt.Errorf("realsvc: %w", err)
	}
	tmp, err := os.MkdirTemp(filepath.Join(cache, "build"), key+".tmp-")
	if err != nil {
		return b, fmt.Errorf("realsvc: %w", err)
	}
	defer os.RemoveAll(tmp)
	t := builds(tmp)
	if err := os.Mkdir(filepath.Join(tmp, "bin"), 0o755); err != nil {
		return b, fmt.Errorf("realsvc: %w", err)
	}
	logf("realsvc: building cmd/memctl from %s", root)
	if _, err := goOutput(root, nil, "build", "-o", t.Memctl, "./cmd/memctl"); err != nil {
		return b, err
	}
	logf("realsvc: building %s@%s (plain, auto, budget)", v.Pushgateway.Path, v.Pushgateway.Version)
	if err := buildPushgateway(filepath.Join(tmp, "src", "pushgateway"), root, v.Pushgateway, t); err != nil {
		return b, err
	}
	logf("realsvc: building %s@%s (plain, auto) and etcdload", v.Etcd.Path, v.Etcd.Version)
	if err := buildEtcd(filepath.Join(tmp, "src", "etcd"), root, v.Etcd, t); err != nil {
		return b, err
	}
	if err := os.WriteFile(filepath.Join(tmp, "done"), nil, 0o644); err != nil {
		return b, fmt.Errorf("realsvc: %w", err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, serr := os.Stat(filepath.Join(dir, "done")); serr == nil {
			return b, nil // built by a concurrent run
		}
		return b, fmt.Errorf("realsvc: %w", err)
	}
	return b, nil
}

// keepBuilds is how many builds the cache keeps (about 180 MB each): the
// ones used last.
const keepBuilds = 3

// prune removes the builds in dir but the keep used last (by the time of
// their "done" file), and unfinished ones more than an hour old.
func prune(dir string, keep int) {
	entries, _ := os.ReadDir(dir)
	type build struct {
		path string
		used time.Time
	}
	var done []build
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if st, err := os.Stat(filepath.Join(p, "done")); err == nil {
			done = append(done, build{p, st.ModTime()})
		} else if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > time.Hour {
			os.RemoveAll(p)
		}
	}
	slices.SortFunc(done, func(a, b build) int { return b.used.Compare(a.used) })
	for _, b := range done[min(keep, len(done)):] {
		os.RemoveAll(b.path)
	}
}

func builds(dir string) Builds {
	bin := func(name string) string { return filepath.Join(dir, "bin", name) }
	return Builds{
		Dir:              dir,
		PushgatewayPlain: bin("pushgateway-plain"), PushgatewayAuto: bin("pushgateway-auto"), PushgatewayBudget: bin("pushgateway-budget"),
		EtcdPlain: bin("etcd-plain"), EtcdAuto: bin("etcd-auto"), EtcdLoad: bin("etcdload"),
		Memctl: bin("memctl"),
	}
}

// buildEnv is the environment of every build in a generated module:
// requirements added as needed, no workspace, this Go toolchain.
var buildEnv = []string{"GOFLAGS=-mod=mod -buildvcs=false", "GOWORK=off", "GOTOOLCHAIN=local"}

// pushgatewayHandle is the line of Pushgateway's main.go that the budget
// variant changes, wrapping the handler of every route in realsvcPush
// (testdata/pushgateway/realsvc_budget.go).
const pushgatewayHandle = `mux.Handle("/", decodeRequest(r))`

// buildPushgateway copies the module's source to src, adds memctl as the
// README tells a user, and builds the three binaries: plain (the module's
// own files), auto (realsvc_auto.go: the blank import) and budget
// (realsvc_budget.go, and main.go with its handler line wrapped).
func buildPushgateway(src, root string, m Module, b Builds) error {
	if err := copyTree(m.Dir, src); err != nil {
		return err
	}
	main := filepath.Join(src, "main.go")
	code, err := os.ReadFile(main)
	if err != nil {
		return fmt.Errorf("realsvc: %w", err)
	}
	if n := bytes.Count(code, []byte(pushgatewayHandle)); n != 1 {
		return fmt.Errorf("realsvc: %s has %d lines %q, want 1: cannot add the budget middleware", main, n, pushgatewayHandle)
	}
	budgetMain := bytes.Replace(code, []byte(pushgatewayHandle), []byte(`mux.Handle("/", realsvcPush(decodeRequest(r)))`), 1)
	files := map[string][]byte{
		"main.go":        append([]byte("//go:build !realsvc_budget\n\n"), code...),
		"main_budget.go": append([]byte("//go:build realsvc_budget\n\n"), budgetMain...),
	}
	for _, name := range []string{"realsvc_auto.go", "realsvc_budget.go"} {
		if files[name], err = added.ReadFile("testdata/pushgateway/" + name); err != nil {
			return fmt.Errorf("realsvc: %w", err)
		}
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(src, name), data, 0o644); err != nil {
			return fmt.Errorf("realsvc: %w", err)
		}
	}
	if err := requireCheckout(src, root); err != nil {
		return err
	}
	for _, x := range []struct{ out, tag string }{{b.PushgatewayPlain, ""}, {b.PushgatewayAuto, "realsvc_auto"}, {b.PushgatewayBudget, "realsvc_budget"}} {
		if _, err := goOutput(src, buildEnv, "build", "-tags="+x.tag, "-o", x.out, "."); err != nil {
			return err
		}
	}
	return nil
}

// buildEtcd generates a module at src with etcd's own main package (the
// server module's main.go, copied), the same with realsvc_auto.go (the
// blank import), and etcdload, and builds them.
func buildEtcd(src, root string, m Module, b Builds) error {
	clientPath := strings.Replace(m.Path, "/server/", "/client/", 1)
	gomod := fmt.Sprintf("module realsvc.test/etcd\n\ngo 1.26.0\n\nrequire (\n\t%s %s\n\t%s %s\n)\n", m.Path, m.Version, clientPath, m.Version)
	main, err := os.ReadFile(filepath.Join(m.Dir, "main.go"))
	if err != nil {
		return fmt.Errorf("realsvc: %s has no main package at its root: %w", m.Path, err)
	}
	auto, err := added.ReadFile("testdata/etcd/realsvc_auto.go")
	if err != nil {
		return fmt.Errorf("realsvc: %w", err)
	}
	load, err := added.ReadFile("testdata/etcdload/main.go")
	if err != nil {
		return fmt.Errorf("realsvc: %w", err)
	}
	for name, data := range map[string][]byte{
		"go.mod":               []byte(gomod),
		"etcd/main.go":         main,
		"etcd/realsvc_auto.go": auto,
		"etcdload/main.go":     load,
	} {
		p := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("realsvc: %w", err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			return fmt.Errorf("realsvc: %w", err)
		}
	}
	if err := requireCheckout(src, root); err != nil {
		return err
	}
	for _, x := range []struct{ out, tag, pkg string }{{b.EtcdPlain, "", "./etcd"}, {b.EtcdAuto, "realsvc_auto", "./etcd"}, {b.EtcdLoad, "", "./etcdload"}} {
		if _, err := goOutput(src, buildEnv, "build", "-tags="+x.tag, "-o", x.out, x.pkg); err != nil {
			return err
		}
	}
	return nil
}

// requireCheckout adds the requirement of memctl and the replace line
// that points it at the checkout, as docs/install.md tells a user.
func requireCheckout(src, root string) error {
	_, err := goOutput(src, buildEnv, "mod", "edit", "-require="+Self+"@v0.0.0", "-replace="+Self+"="+root)
	return err
}

// copyTree copies the regular files and directories under from to to,
// writable (the module cache's are read-only).
func copyTree(from, to string) error {
	return filepath.WalkDir(from, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, p)
		dst := filepath.Join(to, rel)
		if d.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, b, 0o644)
	})
}

// goOutput runs the go command in dir (the current directory when empty)
// with env added to this process's environment, and returns its standard
// output; the error carries its standard error.
func goOutput(dir string, env []string, args ...string) (string, error) {
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 2000 {
			msg = msg[:1000] + "\n...\n" + msg[len(msg)-1000:]
		}
		return string(out), fmt.Errorf("go %s (in %s): %v: %s", strings.Join(args, " "), cmp.Or(dir, "."), err, msg)
	}
	return string(out), nil
}
