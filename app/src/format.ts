/** Field labels and units for telemetry fields. */
export const FIELDS: Record<string, { label: string; unit: string; digits: number }> = {
  "battery.percent": { label: "Battery", unit: "%", digits: 0 },
  "battery.charging": { label: "Charging", unit: "", digits: 0 },
  "battery.voltage_mv": { label: "Battery voltage", unit: "mV", digits: 0 },
  "gnss.latitude": { label: "Latitude", unit: "°", digits: 5 },
  "gnss.longitude": { label: "Longitude", unit: "°", digits: 5 },
  "gnss.altitude_m": { label: "Altitude", unit: "m", digits: 0 },
  "gnss.accuracy_m": { label: "GNSS accuracy", unit: "m", digits: 0 },
  "network.rssi_dbm": { label: "Signal strength", unit: "dBm", digits: 0 },
  "network.signal_level": { label: "Signal level", unit: "", digits: 0 },
  "network.connected": { label: "Network connected", unit: "", digits: 0 },
  "system.uptime_seconds": { label: "Uptime", unit: "s", digits: 0 },
  "system.free_memory_bytes": { label: "Free memory", unit: "B", digits: 0 },
  "system.temperature_c": { label: "Temperature", unit: "°C", digits: 1 },
};

export function formatValue(field: string, value: number): string {
  const f = FIELDS[field];
  if (!f) return String(value);
  if (field === "battery.charging" || field === "network.connected") return value ? "yes" : "no";
  return `${value.toFixed(f.digits)}${f.unit ? ` ${f.unit}` : ""}`;
}

/** "12 s ago", "3 min ago", "2 h ago", else the date. */
export function ago(iso: string | undefined, now = Date.now()): string {
  if (!iso) return "never";
  const t = Date.parse(iso);
  if (Number.isNaN(t)) return "unknown";
  const s = Math.max(0, Math.round((now - t) / 1000));
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86_400) return `${Math.round(s / 3600)} h ago`;
  return new Date(t).toLocaleString();
}
