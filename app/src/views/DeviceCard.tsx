import { computed } from "@preact/signals";
import { useEffect, useState } from "preact/hooks";
import { ago } from "../format.ts";
import { info, runtime, status } from "../state.ts";

const online = computed(() => runtime.value.online);
const battery = computed(() => {
  const s = status.value;
  if (s.battery_percent === undefined) return "unknown";
  return `${s.battery_percent} %${s.charging ? ", charging" : s.charging === false ? ", not charging" : ""}`;
});
const volume = computed(() => {
  const s = status.value;
  if (s.volume === undefined && s.muted === undefined) return "unknown";
  return `${s.volume ?? "?"} %${s.muted ? ", muted" : ""}`;
});
const gnss = computed(() => {
  const s = status.value;
  if (s.gnss_latitude === undefined || s.gnss_longitude === undefined) return "no fix";
  const parts = [`${s.gnss_latitude.toFixed(5)}, ${s.gnss_longitude.toFixed(5)}`];
  if (s.gnss_accuracy_m !== undefined) parts.push(`± ${Math.round(s.gnss_accuracy_m)} m`);
  if (s.gnss_altitude_m !== undefined) parts.push(`${Math.round(s.gnss_altitude_m)} m high`);
  return parts.join(", ");
});
const hardware = computed(() => {
  const h = info.value.hardware;
  if (!h) return undefined;
  const text = [h.manufacturer, h.model].filter(Boolean).join(" ");
  return h.hardware_revision ? `${text} (rev. ${h.hardware_revision})` : text || undefined;
});

/** "last seen" and "reported" texts, kept fresh every 10 s. */
function useNow(ms: number): number {
  const [now, setNow] = useState(Date.now());
  useEffect(() => {
    const t = setInterval(() => setNow(Date.now()), ms);
    return () => clearInterval(t);
  }, [ms]);
  return now;
}

function Ago({ iso }: { iso: string | undefined }) {
  const now = useNow(10_000);
  return <>{ago(iso, now)}</>;
}

/** The device: who it is and its state, updated live from the event stream. */
export function DeviceCard() {
  const i = info.value;
  return (
    <section class="card" aria-labelledby="device-heading">
      <h2 id="device-heading">Device</h2>
      <p class="device-name">
        {i.emoji && <span aria-hidden="true">{i.emoji} </span>}
        <span id="device-name">{i.name ?? "Unnamed device"}</span>
      </p>
      <dl class="facts">
        {hardware.value && (
          <>
            <dt>Hardware</dt>
            <dd id="hardware">{hardware}</dd>
          </>
        )}
        <dt>Connection</dt>
        <dd id="connection">
          <span class={online.value ? "badge online" : "badge offline"}>{online.value ? "Online" : "Offline"}</span>{" "}
          <span class="muted">
            last seen <Ago iso={runtime.value.last_seen_at} />
          </span>
        </dd>
        <dt>Battery</dt>
        <dd id="battery">{battery}</dd>
        <dt>Volume</dt>
        <dd id="volume">{volume}</dd>
        <dt>Location</dt>
        <dd id="gnss">{gnss}</dd>
        <dt>Reported</dt>
        <dd id="reported">
          <Ago iso={status.value.reported_at} />
        </dd>
      </dl>
    </section>
  );
}
