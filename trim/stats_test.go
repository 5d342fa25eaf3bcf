package trim

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestOriginAndReasonNames(t *testing.T) {
	var names []string
	for o := originDebounced; o <= originByName; o++ {
		names = append(names, o.String())
	}
	assert.Equal(t, []string{"debounced", "pressure", "spiral", "by_name"}, names)
	names = nil
	for r := skipNone; r <= skipClosed; r++ {
		names = append(names, r.String())
	}
	assert.Equal(t, []string{"none", "min_release", "cost", "budget", "running", "closed"}, names)
}
