package limits

import (
	"testing"

	"github.com/memctl/memctl/internal/childtest"
)

// children are the child processes the tests of this package start with
// childtest.Command; each test file adds its own from an init function.
var children = map[string]func(){}

func TestMain(m *testing.M) { childtest.Main(m, children) }
