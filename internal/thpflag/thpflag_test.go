package thpflag

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSetRefusesOtherValues(t *testing.T) {
	require.Error(t, Set(2), "PR_THP_DISABLE_EXCEPT_ADVISED alone is no flag value")
	got, err := Get()
	if err == nil {
		assert.Contains(t, []int{Enabled, Disabled, DisabledExceptAdvised}, got)
	}
}
