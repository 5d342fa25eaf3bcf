package state

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEncodeParse(t *testing.T) {
	gml := int64(241591910)
	lim := int64(1 << 20)
	r := &Record{PID: 7, Seq: 3, GoMemLimit: GoMemLimit{Bytes: &gml, Source: "cgroup v1", File: "/sys/fs/cgroup/memory/x/memory.limit_in_bytes",
		MemoryLimitBytes: 256 << 20, Ratio: 0.9, RefreshSeconds: 10, Reason: "why"},
		THP: THP{Policy: "disable", State: "disabled", System: "madvise"}, Trim: Trim{DelaySeconds: 2, Trims: 4, Skipped: 1},
		Pools: []Pool{{Name: "api", Mode: "enforce", LimitBytes: &lim}, {Name: "free", Mode: "observe"}}, Pressure: Pressure{Source: "none"}, CHeap: "glibc"}
	b, err := Encode(r)
	require.NoError(t, err)
	assert.Equal(t, Version, r.Version)
	got, err := Parse(b)
	require.NoError(t, err)
	assert.Equal(t, r, got)

	// Unknown keys, anywhere, are ignored: a newer library adds fields.
	s := strings.Replace(string(b), `"version":1,`, `"version":1,"future":{"x":[1,2]},`, 1)
	s = strings.Replace(s, `"trims":4,`, `"trims":4,"by_origin":{"pressure":2},`, 1)
	got, err = Parse([]byte(s))
	require.NoError(t, err)
	assert.Equal(t, r, got)
}

func TestEncodeTooLarge(t *testing.T) {
	_, err := Encode(&Record{GoMemLimit: GoMemLimit{Reason: strings.Repeat("x", MaxSize)}})
	require.Error(t, err)
}

// Every kind of bad record is rejected whole.
func TestParseRejects(t *testing.T) {
	pools := `[` + strings.Repeat(`{"name":"p","mode":"enforce","limit_bytes":1},`, MaxPools) + `{"name":"p"}]`
	for name, tc := range map[string]struct{ in, want string }{
		"empty":            {``, "record:"},
		"not an object":    {`[1]`, "record:"},
		"no version":       {`{"pid":1}`, `unknown record version "missing"`},
		"version 2":        {`{"version":2}`, `unknown record version "2"`},
		"version string":   {`{"version":"1"}`, `unknown record version "\"1\""`},
		"version huge":     {`{"version":` + strings.Repeat("9", 100) + `}`, `unknown record version "99999999999999999999..."`},
		"wrong type bytes": {`{"version":1,"gomemlimit":{"bytes":"lots"}}`, "cannot unmarshal"},
		"wrong type trims": {`{"version":1,"trim":{"trims":1.5}}`, "cannot unmarshal"},
		"wrong type pools": {`{"version":1,"pools":"api"}`, "cannot unmarshal"},
		"wrong type time":  {`{"version":1,"updated":5}`, "record:"},
		"too many pools":   {`{"version":1,"pools":` + pools + `}`, "65 pools, more than 64"},
		"negative bytes":   {`{"version":1,"gomemlimit":{"bytes":-1}}`, "gomemlimit.bytes -1 is negative"},
		"negative count":   {`{"version":1,"trim":{"skipped":-5}}`, "trim.skipped -5 is negative"},
		"negative limit":   {`{"version":1,"pools":[{"limit_bytes":-2}]}`, "pools[0].limit_bytes -2 is negative"},
		"huge duration":    {`{"version":1,"trim":{"delay_seconds":1e300}}`, "trim.delay_seconds 1e+300 is not a duration"},
		"ratio":            {`{"version":1,"gomemlimit":{"ratio":7}}`, "gomemlimit.ratio 7 is not in [0, 1]"},
		"trailing data":    {`{"version":1} {"version":1}`, "after top-level value"},
		"too large":        {`{"version":1,"x":"` + strings.Repeat("a", MaxSize) + `"}`, "more than 65536"},
	} {
		t.Run(name, func(t *testing.T) {
			r, err := Parse([]byte(tc.in))
			require.Error(t, err)
			assert.Nil(t, r)
			assert.Contains(t, err.Error(), tc.want)
			if strings.Contains(name, "version") && name != "no version" {
				assert.True(t, errors.Is(err, ErrVersion))
			}
		})
	}
}
