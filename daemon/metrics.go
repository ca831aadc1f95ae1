package daemon

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/brokerd/brokerd/detect"
)

// deviceLabels are the labels of every per-device series, as dcgm-exporter
// users expect: the stable ID, the type, the UUID and the marketing name.
var deviceLabels = []string{"device", "type", "uuid", "name"}

// deviceCollector exports the inventory's latest telemetry at scrape time.
// The refresh loop keeps the inventory fresh; reading the snapshot here means
// a device that disappears stops being exported instead of going stale.
type deviceCollector struct {
	devices func() []detect.Entry

	memUsed, memTotal, memBudget, util, memUtil, temp, power, powerLimit,
	smClock, memClock, healthy, cordoned, runnable, cost, info *prometheus.Desc
}

func newDeviceCollector(devices func() []detect.Entry) *deviceCollector {
	d := func(name, help string, extra ...string) *prometheus.Desc {
		return prometheus.NewDesc("brokerd_device_"+name, help, append(append([]string(nil), deviceLabels...), extra...), nil)
	}
	return &deviceCollector{
		devices:    devices,
		memUsed:    d("memory_used_bytes", "Device memory in use."),
		memTotal:   d("memory_total_bytes", "Device memory in total."),
		memBudget:  d("memory_budget_bytes", "Device memory brokerd may use under the memory strategy."),
		util:       d("utilization_ratio", "Device compute utilization, 0 to 1."),
		memUtil:    d("memory_utilization_ratio", "Device memory-bandwidth utilization, 0 to 1."),
		temp:       d("temperature_celsius", "Device temperature."),
		power:      d("power_watts", "Device power draw."),
		powerLimit: d("power_limit_watts", "Device enforced power limit."),
		smClock:    d("sm_clock_hertz", "Device SM clock."),
		memClock:   d("memory_clock_hertz", "Device memory clock."),
		healthy:    d("healthy", "1 when the device is healthy, 0 when not."),
		cordoned:   d("cordoned", "1 when the device is cordoned (takes no new batches)."),
		runnable:   d("runnable", "1 when a runtime adapter of this build can run work on the device."),
		cost:       d("cost_per_hour_usd", "Configured device cost in dollars per hour."),
		info:       d("info", "Device facts as labels; the value is always 1.", "vendor", "runtime", "driver_version", "pci_bus_id"),
	}
}

func (c *deviceCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.memUsed, c.memTotal, c.memBudget, c.util, c.memUtil, c.temp, c.power,
		c.powerLimit, c.smClock, c.memClock, c.healthy, c.cordoned, c.runnable, c.cost, c.info} {
		ch <- d
	}
}

func (c *deviceCollector) Collect(ch chan<- prometheus.Metric) {
	for _, e := range c.devices() {
		labels := []string{e.ID, string(e.Type), e.UUID, e.Name}
		gauge := func(desc *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, labels...)
		}
		t := e.Telemetry
		total := t.MemoryTotal
		if total == 0 {
			total = e.MemoryTotal
		}
		gauge(c.memTotal, float64(total))
		gauge(c.memUsed, float64(t.MemoryUsed))
		gauge(c.memBudget, float64(e.Budget))
		gauge(c.util, t.UtilizationPercent/100)
		gauge(c.healthy, boolFloat(e.Health != detect.Unhealthy))
		gauge(c.cordoned, boolFloat(e.Cordoned))
		gauge(c.runnable, boolFloat(e.Runnable()))
		gauge(c.cost, e.CostPerHour)
		// Readings a device type does not have (a CPU's temperature through
		// this path, a TPU's clocks) are left out rather than exported as 0.
		if e.Type == detect.TypeGPU {
			gauge(c.memUtil, t.MemoryUtilizationPercent/100)
			gauge(c.temp, t.TemperatureC)
			gauge(c.power, t.PowerW)
			gauge(c.powerLimit, t.PowerLimitW)
			gauge(c.smClock, float64(t.SMClockMHz)*1e6)
			gauge(c.memClock, float64(t.MemClockMHz)*1e6)
		}
		ch <- prometheus.MustNewConstMetric(c.info, prometheus.GaugeValue, 1,
			append(labels, e.Vendor, e.Runtime, e.DriverVersion, e.PCIBusID)...)
	}
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
