package server

import (
	"fmt"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// NewLogger builds brokerd's logger: JSON for production, console for people.
func NewLogger(level, format string) (*zap.Logger, error) {
	l, _, err := NewLoggerLevel(level, format)
	return l, err
}

// NewLoggerLevel is NewLogger with the level it can be changed through
// while brokerd runs (Options.LogLevel).
func NewLoggerLevel(level, format string) (*zap.Logger, *zap.AtomicLevel, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, nil, fmt.Errorf("log level: %w", err)
	}
	var cfg zap.Config
	switch format {
	case "json", "":
		cfg = zap.NewProductionConfig()
	case "console":
		cfg = zap.NewDevelopmentConfig()
		cfg.EncoderConfig.EncodeLevel = zapcore.CapitalColorLevelEncoder
	default:
		return nil, nil, fmt.Errorf("log format %q: want json or console", format)
	}
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	cfg.EncoderConfig.TimeKey = "ts"
	cfg.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	cfg.DisableStacktrace = lvl > zapcore.DebugLevel
	l, err := cfg.Build()
	if err != nil {
		return nil, nil, err
	}
	return l, &cfg.Level, nil
}
