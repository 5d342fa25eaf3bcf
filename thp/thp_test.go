package thp

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStateString(t *testing.T) {
	assert.Equal(t, "enabled", StateEnabled.String())
	assert.Equal(t, "disabled", StateDisabled.String())
	assert.Equal(t, "disabled-except-advised", StateDisabledExceptAdvised.String())
	assert.Equal(t, "State(2)", State(2).String())
	assert.Equal(t, "State(-1)", State(-1).String())
}

func TestParsePolicy(t *testing.T) {
	for in, want := range map[string]Policy{
		"keep":           PolicyKeep,
		"disable":        PolicyDisable,
		"except-advised": PolicyExceptAdvised,
		" Disable\n":     PolicyDisable,
		"EXCEPT-ADVISED": PolicyExceptAdvised,
	} {
		got, err := ParsePolicy(in)
		require.NoError(t, err, "%q", in)
		assert.Equal(t, want, got, "%q", in)
	}
	for _, in := range []string{"", "off", "disabled", "except_advised", "keep disable"} {
		_, err := ParsePolicy(in)
		require.Error(t, err, "%q", in)
		assert.Contains(t, err.Error(), "thp: unknown policy")
		assert.Contains(t, err.Error(), "keep, disable or except-advised")
	}
}

func TestPolicyText(t *testing.T) {
	for _, p := range []Policy{PolicyKeep, PolicyDisable, PolicyExceptAdvised} {
		b, err := p.MarshalText()
		require.NoError(t, err)
		assert.Equal(t, p.String(), string(b))
		var q Policy
		require.NoError(t, q.UnmarshalText(b))
		assert.Equal(t, p, q)
	}
	assert.Equal(t, "Policy(7)", Policy(7).String())
	_, err := Policy(7).MarshalText()
	assert.ErrorContains(t, err, "thp: invalid policy 7")
	_, err = Policy(-1).Apply()
	assert.ErrorContains(t, err, "thp: invalid policy -1")

	q := PolicyDisable
	assert.Error(t, q.UnmarshalText([]byte("sometimes")))
	assert.Equal(t, PolicyDisable, q, "a failed UnmarshalText leaves the value alone")
}

func TestParseChoice(t *testing.T) {
	for in, want := range map[string]string{
		"always [madvise] never\n":                     "madvise",
		"[always] madvise never":                       "always",
		"always defer [defer+madvise] madvise never":   "defer+madvise",
		"always within_size advise [never] deny force": "never",
		"[x]": "x",
	} {
		got, err := parseChoice(in)
		require.NoError(t, err, "%q", in)
		assert.Equal(t, want, got, "%q", in)
	}
	for _, in := range []string{
		"", "\n", "always madvise never", "[always] [madvise]", "[]", "[ madvise ]",
		"always [Madvise] never", "always [madvise never", "always madvise] never", "[[madvise]]",
	} {
		_, err := parseChoice(in)
		assert.Error(t, err, "%q", in)
	}
}

func TestReadSettings(t *testing.T) {
	s, err := readSettings("testdata/sysfs/madvise")
	require.NoError(t, err)
	assert.Equal(t, Settings{
		Enabled:     "madvise",
		PMDEnabled:  "inherit",
		Defrag:      "madvise",
		PMDSize:     2 << 20,
		MaxPTEsNone: 511,
	}, s)
	assert.Equal(t, "madvise", s.PMDMode())

	s, err = readSettings("testdata/sysfs/old-always")
	require.NoError(t, err)
	assert.Equal(t, Settings{Enabled: "always", Defrag: "always", MaxPTEsNone: -1}, s)
	assert.Equal(t, "always", s.PMDMode())

	s, err = readSettings("testdata/sysfs/pmd-never")
	require.NoError(t, err)
	assert.Equal(t, Settings{
		Enabled:     "always",
		PMDEnabled:  "never",
		Defrag:      "defer+madvise",
		PMDSize:     512 << 20,
		MaxPTEsNone: 0,
	}, s)
	assert.Equal(t, "never", s.PMDMode(), "the per-size file wins over the top-level mode")
}

func TestReadSettingsMalformed(t *testing.T) {
	for dir, file := range map[string]string{
		"bad-nobracket":   "enabled",
		"bad-twobrackets": "enabled",
		"bad-empty":       "enabled",
		"bad-word":        "enabled",
		"bad-defrag":      "defrag",
		"no-defrag":       "defrag",
		"bad-pmdsize":     "hpage_pmd_size",
		"zero-pmdsize":    "hpage_pmd_size",
		"bad-ptes":        "khugepaged/max_ptes_none",
		"bad-persize":     "hugepages-2048kB/enabled",
	} {
		t.Run(dir, func(t *testing.T) {
			_, err := readSettings(filepath.Join("testdata/sysfs", dir))
			require.Error(t, err)
			assert.Contains(t, err.Error(), filepath.Join("testdata/sysfs", dir, file), "the error names the file")
			assert.Regexp(t, "^thp: ", err.Error())
			assert.NotErrorIs(t, err, errors.ErrUnsupported)
		})
	}
}

func TestReadSettingsMissing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "transparent_hugepage")
	_, err := readSettings(dir)
	require.Error(t, err)
	assert.ErrorIs(t, err, errors.ErrUnsupported, "no sysfs dir: a kernel without THP")
	assert.ErrorIs(t, err, fs.ErrNotExist)
	assert.Contains(t, err.Error(), filepath.Join(dir, "enabled"))
}

func TestReadSettingsUnreadable(t *testing.T) {
	// A directory where a file should be: unreadable even for root.
	dir := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dir, "enabled"), 0o755))
	_, err := readSettings(dir)
	require.Error(t, err)
	assert.Contains(t, err.Error(), filepath.Join(dir, "enabled"))
	assert.NotErrorIs(t, err, errors.ErrUnsupported)
}

func TestStateMarshalText(t *testing.T) {
	b, err := json.Marshal(map[string]State{"a": StateDisabled, "b": StateDisabledExceptAdvised, "c": State(7)})
	require.NoError(t, err)
	assert.JSONEq(t, `{"a":"disabled","b":"disabled-except-advised","c":"State(7)"}`, string(b))
}
