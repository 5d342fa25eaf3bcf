//go:build linux && cgo

package otelmetrics

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/memctl/memctl"
	"github.com/memctl/memctl/internal/dlburst"
)

// TestCAllocatorObjectNotUTF8: an allocator's object whose path is not
// valid UTF-8 is observed with an object attribute that is (invalid bytes
// replaced): OTLP carries attributes as protobuf strings, which must be
// UTF-8, and an exporter fails the whole export on one that is not. Before
// the fix the attribute held the raw bytes.
func TestCAllocatorObjectNotUTF8(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "caf\xe9")
	require.NoError(t, os.Mkdir(dir, 0o755))
	so := filepath.Join(dir, "libhidden21.so")
	dlburst.Build(t, so, dlburst.HiddenJemalloc)
	require.NoError(t, dlburst.Open(so, true))

	prevLimit := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(prevLimit)
	for _, k := range []string{"MEMCTL", "MEMCTL_TRIM_DELAY", "GOMEMLIMIT", "AUTOMEMLIMIT", "MEMCTL_BUDGETS"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	t.Setenv("MEMCTL_PRESSURE", "off")
	ctl, err := memctl.Start(memctl.WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	defer ctl.Close()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	reg, err := Register(mp, ctl)
	require.NoError(t, err)
	defer func() { _ = reg.Unregister() }()

	got := collect(t, reader)
	want := strings.ToValidUTF8(so, "\uFFFD")
	v, _ := one(t, got, "memctl.c_allocator.info", attribute.String("allocator", "jemalloc"), attribute.String("object", want),
		attribute.String("prefix", ""), attribute.Bool("owner", false), attribute.Bool("trimmed", false))
	assert.Equal(t, int64(1), v)
}
