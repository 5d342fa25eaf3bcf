package arenamax

import (
	"bytes"
	"debug/elf"
	"io"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestOperator(t *testing.T) {
	cases := []struct {
		name      string
		env       map[string]string
		wantName  string
		wantValue string
	}{
		{"nothing set", nil, "", ""},
		{"MALLOC_ARENA_MAX", map[string]string{"MALLOC_ARENA_MAX": "4"}, "MALLOC_ARENA_MAX", "4"},
		{"empty MALLOC_ARENA_MAX is not a setting", map[string]string{"MALLOC_ARENA_MAX": ""}, "", ""},
		{"tunable alone", map[string]string{"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"},
			"GLIBC_TUNABLES", "glibc.malloc.arena_max=2"},
		{"tunable among others", map[string]string{"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0:glibc.malloc.arena_max=3"},
			"GLIBC_TUNABLES", "glibc.malloc.tcache_count=0:glibc.malloc.arena_max=3"},
		{"other tunables only", map[string]string{"GLIBC_TUNABLES": "glibc.malloc.arena_test=2:glibc.malloc.trim_threshold=0"}, "", ""},
		{"empty tunable value", map[string]string{"GLIBC_TUNABLES": "glibc.malloc.arena_max="}, "", ""},
		// glibc applies the tunable over its alias, whichever comes first.
		{"the tunable wins over MALLOC_ARENA_MAX", map[string]string{"MALLOC_ARENA_MAX": "1", "GLIBC_TUNABLES": "glibc.malloc.arena_max=3"},
			"GLIBC_TUNABLES", "glibc.malloc.arena_max=3"},
		{"MALLOC_ARENA_MAX when the tunable is invalid", map[string]string{"MALLOC_ARENA_MAX": "2", "GLIBC_TUNABLES": "glibc.malloc.arena_max=0"},
			"MALLOC_ARENA_MAX", "2"},
		{"space before the name is another name", map[string]string{"GLIBC_TUNABLES": " glibc.malloc.arena_max=4"}, "", ""},
		{"space after the name is another name", map[string]string{"GLIBC_TUNABLES": "glibc.malloc.arena_max =4"}, "", ""},
		{"MALLOC_ARENA_MAX=0 is below glibc's minimum", map[string]string{"MALLOC_ARENA_MAX": "0"}, "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			name, value, ok := Operator(env(c.env))
			assert.Equal(t, c.wantName != "", ok)
			assert.Equal(t, c.wantName, name)
			assert.Equal(t, c.wantValue, value)
		})
	}
}

// arenaMaxCases are environments and whether glibc caps its arenas under
// them. agree is false where glibc versions differ (2.36 applies the cap,
// 2.39 and later ignore it): Operator says no cap there.
var arenaMaxCases = []struct {
	env   []string
	cap   bool
	agree bool
}{
	{nil, false, true},
	{[]string{"MALLOC_ARENA_MAX="}, false, true},
	{[]string{"MALLOC_ARENA_MAX=0"}, false, true},
	{[]string{"MALLOC_ARENA_MAX=-0"}, false, true},
	{[]string{"MALLOC_ARENA_MAX=abc"}, false, true},
	{[]string{"MALLOC_ARENA_MAX=0x"}, false, true},
	{[]string{"MALLOC_ARENA_MAX=4"}, true, true},
	{[]string{"MALLOC_ARENA_MAX= 4"}, true, true},
	{[]string{"MALLOC_ARENA_MAX=\t4"}, true, true},
	{[]string{"MALLOC_ARENA_MAX=+3"}, true, true},
	{[]string{"MALLOC_ARENA_MAX=-1"}, true, true},
	{[]string{"MALLOC_ARENA_MAX=0x10"}, true, true},
	{[]string{"MALLOC_ARENA_MAX=010"}, true, true},
	{[]string{"MALLOC_ARENA_MAX=4x"}, false, false},
	{[]string{"MALLOC_ARENA_MAX=1 "}, false, false},
	{[]string{"MALLOC_ARENA_MAX=08"}, false, true},
	{[]string{"MALLOC_ARENA_MAX=99999999999999999999999"}, false, false},
	{[]string{"GLIBC_TUNABLES="}, false, true},
	{[]string{"GLIBC_TUNABLES=glibc.malloc.arena_max="}, false, true},
	{[]string{"GLIBC_TUNABLES= glibc.malloc.arena_max=4"}, false, true},
	{[]string{"GLIBC_TUNABLES=glibc.malloc.arena_max =4"}, false, true},
	{[]string{"GLIBC_TUNABLES=glibc.malloc.arena_max_x=4"}, false, true},
	{[]string{"GLIBC_TUNABLES=glibc.malloc.arena_max=4"}, true, true},
	{[]string{"GLIBC_TUNABLES=glibc.malloc.arena_max= 4"}, true, true},
	{[]string{"GLIBC_TUNABLES=foo:glibc.malloc.arena_max=4"}, true, true},
	{[]string{"GLIBC_TUNABLES=glibc.malloc.check=0:glibc.malloc.arena_max=4:glibc.malloc.tcache_count=0"}, true, true},
	{[]string{"GLIBC_TUNABLES=glibc.malloc.arena_max=4:glibc.malloc.arena_max=5"}, true, true},
	{[]string{"GLIBC_TUNABLES=glibc.malloc.arena_max=0:glibc.malloc.arena_max=5"}, true, true},
	{[]string{"GLIBC_TUNABLES=glibc.malloc.arena_max=4:glibc.malloc.arena_max=0"}, false, false},
	{[]string{"GLIBC_TUNABLES=glibc.malloc.arena_max=4x"}, false, false},
	{[]string{"GLIBC_TUNABLES=glibc.malloc.arena_max=4=5"}, false, false},
	{[]string{"GLIBC_TUNABLES=x=y=z:glibc.malloc.arena_max=3"}, false, false},
	{[]string{"GLIBC_TUNABLES=glibc.malloc.arena_max=3:x"}, false, false},
	{[]string{"GLIBC_TUNABLES=glibc.malloc.arena_max=3:"}, false, false},
	{[]string{"GLIBC_TUNABLES=glibc.malloc.arena_max=0", "MALLOC_ARENA_MAX=2"}, true, true},
	{[]string{"MALLOC_ARENA_MAX=2", "GLIBC_TUNABLES=glibc.malloc.arena_max="}, true, true},
	{[]string{"MALLOC_ARENA_MAX=", "GLIBC_TUNABLES=glibc.malloc.arena_max="}, false, true},
	{[]string{"GLIBC_TUNABLES=glibc.malloc.arena_max=3:", "MALLOC_ARENA_MAX=2"}, true, true},
}

func envOf(kvs []string) func(string) string {
	m := map[string]string{}
	for _, kv := range kvs {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return env(m)
}

func TestOperatorCases(t *testing.T) {
	for _, c := range arenaMaxCases {
		_, _, ok := Operator(envOf(c.env))
		assert.Equal(t, c.cap && c.agree, ok, "%q", c.env)
	}
}

// TestOperatorMatchesGlibc runs this system's dynamic loader with
// --list-tunables (glibc 2.33 and later) under each environment and checks
// that Operator reports a cap exactly when glibc sets one, except
// where glibc versions disagree (then it must say no cap).
func TestOperatorMatchesGlibc(t *testing.T) {
	ldso := dynamicLoader(t)
	for _, c := range arenaMaxCases {
		cmd := exec.Command(ldso, "--list-tunables")
		cmd.Env = c.env
		if cmd.Env == nil {
			cmd.Env = []string{}
		}
		out, err := cmd.Output()
		require.NoError(t, err, "%s --list-tunables, env %q", ldso, c.env)
		m := regexp.MustCompile(`(?m)^glibc\.malloc\.arena_max: 0x([0-9a-f]+) `).FindSubmatch(out)
		require.NotNil(t, m, "no arena_max in %s --list-tunables:\n%s", ldso, out)
		glibcCap := string(m[1]) != "0"
		_, _, ok := Operator(envOf(c.env))
		if c.agree {
			assert.Equal(t, glibcCap, ok, "env %q: glibc arena_max 0x%s, Operator %v", c.env, m[1], ok)
		} else {
			assert.False(t, ok, "env %q: glibc versions disagree, want no cap", c.env)
			t.Logf("env %q: this glibc reads arena_max 0x%s (versions disagree)", c.env, m[1])
		}
	}
}

// dynamicLoader returns the path of glibc's dynamic loader, the ELF
// interpreter of /bin/sh, or skips t when there is none that lists tunables.
func dynamicLoader(t *testing.T) string {
	t.Helper()
	f, err := elf.Open("/bin/sh")
	if err != nil {
		t.Skipf("no ELF /bin/sh to find the dynamic loader: %v", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		b, err := io.ReadAll(p.Open())
		require.NoError(t, err)
		ldso := strings.TrimRight(string(b), "\x00")
		if out, err := exec.Command(ldso, "--list-tunables").Output(); err != nil || !bytes.Contains(out, []byte("glibc.malloc.arena_max:")) {
			t.Skipf("%s --list-tunables does not list glibc.malloc.arena_max (not glibc 2.33 or later?): %v", ldso, err)
		}
		return ldso
	}
	t.Skip("/bin/sh has no ELF interpreter (static)")
	return ""
}
