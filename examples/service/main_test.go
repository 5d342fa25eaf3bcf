package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/childtest"
)

func TestMain(m *testing.M) {
	childtest.Main(m, map[string]func(){"service": main})
}

// The README's complete small service is this file, as it is.
func TestREADMEShowsThisFile(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	src, err := os.ReadFile("main.go")
	require.NoError(t, err)
	code := string(src)
	code = code[strings.Index(code, "package main"):]
	assert.Contains(t, string(readme), "```go\n"+code+"```\n", "README.md must show examples/service/main.go from \"package main\" on")
}

// The service answers as its doc says: a small sum, a 429 for a request
// over its budget, and the /debug/memctl page.
func TestService(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0])
	cmd.Env = childtest.Env("service", []string{"GOMEMLIMIT", "MEMCTL", "MEMCTL_BUDGETS"}, "ADDR="+addr, "GOMEMLIMIT=512MiB")
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()

	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + addr + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			break
		}
		require.False(t, time.Now().After(deadline), "the service did not listen in 30 s")
	}

	code, body := get("/sum?n=1000")
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "499500\n", body)

	code, body = get("/sum?n=100000000")
	assert.Equal(t, http.StatusTooManyRequests, code, "800 MB against a 64 MiB budget")
	var e struct{ Code string }
	require.NoError(t, json.Unmarshal([]byte(body), &e), body)
	assert.Equal(t, "resource_exhausted", e.Code)

	code, _ = get("/sum?n=-1")
	assert.Equal(t, http.StatusBadRequest, code)

	code, body = get("/debug/memctl")
	require.Equal(t, http.StatusOK, code)
	var doc struct {
		GoMemLimit struct {
			Bytes  int64
			Source string
		}
		Pools []struct {
			Name       string
			LimitBytes int64 `json:"limit_bytes"`
		}
	}
	require.NoError(t, json.Unmarshal([]byte(body), &doc), body)
	assert.Equal(t, int64(512<<20), doc.GoMemLimit.Bytes, "the operator's GOMEMLIMIT")
	assert.Equal(t, "env", doc.GoMemLimit.Source)
	require.Len(t, doc.Pools, 1)
	assert.Equal(t, "http", doc.Pools[0].Name)
	assert.Equal(t, int64(256<<20), doc.Pools[0].LimitBytes, "half of GOMEMLIMIT")
}
