import { useSignal } from "@preact/signals";
import { useEffect } from "preact/hooks";
import { request } from "../api.ts";
import { FIELDS } from "../format.ts";
import { sessionProblem } from "../live.ts";
import { connectedCount, onTelemetry } from "../state.ts";
import { Chart, RANGES, type Range } from "./Chart.tsx";
import { Track } from "./Track.tsx";

const ORDER = Object.keys(FIELDS);

/** Telemetry: a chart per field that has data, over the chosen range, and the GNSS track. */
export function Telemetry({ bearer }: { bearer: string }) {
  const range = useSignal<Range>("hour");
  const fields = useSignal<string[]>([]);
  const reconnects = connectedCount.value;

  const add = (names: string[]) => {
    const next = new Set([...fields.value, ...names.filter((n) => n in FIELDS && n !== "gnss.latitude" && n !== "gnss.longitude")]);
    if (next.size !== fields.value.length) fields.value = ORDER.filter((f) => next.has(f));
  };

  useEffect(() => {
    const abort = new AbortController();
    request<{ values: Array<{ field: string }> }>("GET", "/side-control/telemetry/latest", { bearer, signal: abort.signal }).then(
      (r) => add(r.values.map((v) => v.field)),
      (err: unknown) => {
        if ((err as Error)?.name !== "AbortError") sessionProblem(err);
      },
    );
    const off = onTelemetry((values) => add(values.map((v) => v.field)));
    return () => {
      abort.abort();
      off();
    };
  }, [bearer, reconnects]);

  return (
    <section class="card" aria-labelledby="telemetry-heading">
      <h2 id="telemetry-heading">Telemetry</h2>
      <fieldset class="ranges">
        <legend>Range</legend>
        {(Object.keys(RANGES) as Range[]).map((r) => (
          <label key={r}>
            <input type="radio" name="range" value={r} checked={range.value === r} onChange={() => (range.value = r)} />
            {RANGES[r].label}
          </label>
        ))}
      </fieldset>
      <Track range={range.value} bearer={bearer} />
      {fields.value.length === 0 && <p class="muted">No telemetry yet. Charts appear when the device reports.</p>}
      {fields.value.map((f) => (
        <Chart key={f} field={f} range={range.value} bearer={bearer} />
      ))}
    </section>
  );
}
