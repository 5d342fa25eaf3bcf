package childtest

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestMain(m *testing.M) {
	Main(m, map[string]func(){
		"echo": func() {
			Say("HELLO", "world")
			Say("N", 42)
			Say("DROPPED", os.Getenv("MEMCTL_DROPPED"))
			Say("EXTRA", os.Getenv("EXTRA"))
		},
	})
}

func TestChildReport(t *testing.T) {
	t.Setenv("MEMCTL_DROPPED", "yes")
	r := Report(t, Command(t, "echo", []string{"MEMCTL_DROPPED"}, "EXTRA=1"))
	assert.Equal(t, "world", r["HELLO"])
	assert.Equal(t, "42", r["N"])
	assert.Empty(t, r["DROPPED"], "unset variables are not passed on")
	assert.Equal(t, "1", r["EXTRA"])
}

func TestParseReport(t *testing.T) {
	r := ParseReport([]byte("A=1\nnot a pair\nB C=2\nA=3\n=x\n"))
	assert.Equal(t, map[string]string{"A": "3"}, r)
}
