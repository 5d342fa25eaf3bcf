package realsvc

import (
	"cmp"
	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/stretchr/testify/require"
	"os"
	"strings"
	"testing"
	"time"
)

// The pinned versions (issue 36); REALSVC_ETCD and REALSVC_PUSHGATEWAY
// (a version such as v3.6.13) pin others.
const (
	etcdModule, etcdVersion               = "go.etcd.io/etcd/server/v3", "v3.6.8"
	pushgatewayModule, pushgatewayVersion = "github.com/prometheus/pushgateway", "v1.11.1"
)

// TestRealServices fetches, builds and runs the real services (package
// doc) and checks what a user would, each memctl variant beside the plain
// service in the same run; the results table is its last log line. It runs
// only with MEMCTL_REALSVC=1, as root on a cgroup v1 host, and skips with
// the reason where a service cannot be fetched or built. Checks that need
// an open issue's fix say so ("needs issue N") and fail until it lands.
func TestRealServices(t *testing.T) {
	if os.Getenv("MEMCTL_REALSVC") != "1" {
		t.Skip("realsvc: the real-service suite fetches and builds etcd and Pushgateway and runs them for minutes; run it with MEMCTL_REALSVC=1 go test -count=1 -timeout 30m -v -run TestRealServices ./internal/realsvc")
	}
	p, err := cgrouptest.WritableParent()
	if err != nil {
		t.Skipf("realsvc: needs a child memory cgroup: %v", err)
	}
	if p.Version != 1 {
		t.Skipf("realsvc: reads cgroup v1 memory.stat; this host's memory cgroup is v%d", p.Version)
	}
	t0 := time.Now()
	t.Logf("realsvc: load average at the start: %s (the checks' timing stretches on a loaded machine)", loadavg())
	defer func() { t.Logf("realsvc: load average at the end: %s", loadavg()) }()
	root, err := Checkout()
	require.NoError(t, err)
	cache := DefaultCache()
	var v Versions
	for _, x := range []struct {
		m          *Module
		path, want string
	}{{&v.Etcd, etcdModule, cmp.Or(os.Getenv("REALSVC_ETCD"), etcdVersion)}, {&v.Pushgateway, pushgatewayModule, cmp.Or(os.Getenv("REALSVC_PUSHGATEWAY"), pushgatewayVersion)}} {
		if *x.m, err = Resolve(x.path, x.want); err != nil {
			t.Skipf("realsvc: cannot fetch a service: %v", err)
		}
		if x.m.Note != "" {
			t.Logf("realsvc: %s", x.m.Note)
		}
	}
	hash, err := SourceHash(root, "./auto", "./limits", "./cmd/memctl")
	require.NoError(t, err)
	goVersion, err := goOutput("", nil, "env", "GOVERSION")
	require.NoError(t, err)
	key, err := Key(strings.TrimSpace(goVersion), v, hash)
	require.NoError(t, err)
	b, err := Build(cache, key, root, v, t.Logf)
	if err != nil {
		t.Skipf("realsvc: cannot build a service: %v", err)
	}
	how := "built"
	if b.Cached {
		how = "cached"
	}
	t.Logf("realsvc: %s@%s and %s@%s against %s: %s in %.1f s (%s)", v.Etcd.Path, v.Etcd.Version, v.Pushgateway.Path, v.Pushgateway.Version, root, how, time.Since(t0).Seconds(), b.Dir)

	var tab Table
	t.Run("etcd", func(t *testing.T) { testEtcd(t, b, v.Etcd, cache, &tab) })
	t.Run("pushgateway", func(t *testing.T) { testPushgateway(t, b, &tab) })
	t.Logf("realsvc: %d checks in %.0f s; each memctl variant beside plain in the same run:\n%s", len(tab.Rows), time.Since(t0).Seconds(), tab.String())
}
