package logattr

import (
	"bytes"
	"log/slog"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestAttrs(t *testing.T) {
	var b bytes.Buffer
	log := slog.New(slog.NewTextHandler(&b, nil))
	log.LogAttrs(t.Context(), slog.LevelInfo, "x", Bytes("a", 5), Bytes("b", -1), Bytes("c", math.MinInt64),
		GoMemLimit("d", 100<<20), GoMemLimit("e", math.MaxInt64), GoMemLimit("f", -1))
	assert.Contains(t, b.String(), " a=5 b=unknown c=unknown d=104857600 e=off f=unknown\n")
}
