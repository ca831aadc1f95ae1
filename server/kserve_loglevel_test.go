package server

import (
	"testing"

	"github.com/brokerd/brokerd/proto/inference"
	"go.uber.org/zap/zapcore"
)

func TestLogLevelFromTritonSettings(t *testing.T) {
	b := func(v bool) *inference.LogSettingsRequest_SettingValue {
		return &inference.LogSettingsRequest_SettingValue{ParameterChoice: &inference.LogSettingsRequest_SettingValue_BoolParam{BoolParam: v}}
	}
	u := func(v uint32) *inference.LogSettingsRequest_SettingValue {
		return &inference.LogSettingsRequest_SettingValue{ParameterChoice: &inference.LogSettingsRequest_SettingValue_Uint32Param{Uint32Param: v}}
	}
	tests := []struct {
		name     string
		cur      zapcore.Level
		settings map[string]*inference.LogSettingsRequest_SettingValue
		want     zapcore.Level
		err      bool
	}{
		{"verbose on", zapcore.InfoLevel, map[string]*inference.LogSettingsRequest_SettingValue{"log_verbose_level": u(1)}, zapcore.DebugLevel, false},
		{"verbose off", zapcore.DebugLevel, map[string]*inference.LogSettingsRequest_SettingValue{"log_verbose_level": u(0)}, zapcore.InfoLevel, false},
		{"info off", zapcore.InfoLevel, map[string]*inference.LogSettingsRequest_SettingValue{"log_info": b(false)}, zapcore.WarnLevel, false},
		{"all off", zapcore.InfoLevel, map[string]*inference.LogSettingsRequest_SettingValue{"log_info": b(false), "log_warning": b(false), "log_error": b(false)}, zapcore.DPanicLevel, false},
		{"warning back on", zapcore.ErrorLevel, map[string]*inference.LogSettingsRequest_SettingValue{"log_warning": b(true)}, zapcore.WarnLevel, false},
		{"log file", zapcore.InfoLevel, map[string]*inference.LogSettingsRequest_SettingValue{"log_file": {ParameterChoice: &inference.LogSettingsRequest_SettingValue_StringParam{StringParam: "/tmp/x"}}}, zapcore.InfoLevel, true},
		{"wrong type", zapcore.InfoLevel, map[string]*inference.LogSettingsRequest_SettingValue{"log_info": u(1)}, zapcore.InfoLevel, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := logLevelFrom(tt.cur, tt.settings)
			if (err != nil) != tt.err || (!tt.err && got != tt.want) {
				t.Errorf("got %v, %v; want %v (error %v)", got, err, tt.want, tt.err)
			}
		})
	}
}
