import { useEffect, useRef, useState } from "preact/hooks";
import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";
import { request } from "../api.ts";
import { FIELDS, formatValue } from "../format.ts";
import { sessionProblem } from "../live.ts";
import { connectedCount, onTelemetry } from "../state.ts";

export type Range = "hour" | "day" | "week";
/** Each range as a window and a bucket width: at most 100 buckets, so a chart never asks for many points. */
export const RANGES: Record<Range, { label: string; ms: number; bucket: number }> = {
  hour: { label: "Hour", ms: 3_600_000, bucket: 60_000 },
  day: { label: "Day", ms: 86_400_000, bucket: 900_000 },
  week: { label: "Week", ms: 7 * 86_400_000, bucket: 7_200_000 },
};

interface Aggregate {
  points: Array<{ bucket_start_time_ms: number; value: number }>;
}

/** One telemetry field over the range: bucket averages from the aggregate route, then live points appended. */
export function Chart({ field, range, bearer }: { field: string; range: Range; bearer: string }) {
  const box = useRef<HTMLDivElement>(null);
  const plot = useRef<uPlot | null>(null);
  const data = useRef<{ t: number[]; v: number[] }>({ t: [], v: [] });
  const [latest, setLatest] = useState<number | undefined>(undefined);
  const [count, setCount] = useState(0);
  const [problem, setProblem] = useState<string | undefined>(undefined);
  const reconnects = connectedCount.value;
  /** The window shown: the whole range up to now, whatever the data covers. */
  const windowMs = useRef(RANGES[range].ms);
  windowMs.current = RANGES[range].ms;

  useEffect(() => {
    const el = box.current;
    if (!el) return;
    const u = new uPlot(
      {
        width: Math.max(200, el.clientWidth),
        height: 140,
        legend: { show: false },
        cursor: { show: true, drag: { x: false, y: false } },
        scales: {
          x: {
            time: true,
            range: () => {
              const now = Date.now() / 1000;
              return [now - windowMs.current / 1000, now];
            },
          },
        },
        axes: [
          { stroke: "#333", grid: { stroke: "#e3e3e3" }, ticks: { stroke: "#ccc" } },
          { stroke: "#333", grid: { stroke: "#e3e3e3" }, ticks: { stroke: "#ccc" }, size: 48 },
        ],
        series: [{}, { label: FIELDS[field]?.label ?? field, stroke: "#0b4f8a", width: 2, fill: "rgba(11,79,138,0.08)", points: { show: true, size: 4 } }],
      },
      [[], []],
      el,
    );
    plot.current = u;
    const resize = new ResizeObserver(() => u.setSize({ width: Math.max(200, el.clientWidth), height: 140 }));
    resize.observe(el);
    return () => {
      resize.disconnect();
      u.destroy();
      plot.current = null;
    };
  }, [field]);

  const draw = () => {
    const { t, v } = data.current;
    plot.current?.setData([t.map((ms) => ms / 1000), v]);
    setCount(t.length);
    setLatest(v.at(-1));
  };

  useEffect(() => {
    const abort = new AbortController();
    const { ms, bucket } = RANGES[range];
    const end = Date.now() + 1;
    const start = end - ms;
    const q = new URLSearchParams({ field, aggregate: "avg", bucket_ms: String(bucket), start_time_ms: String(start), end_time_ms: String(end) });
    request<Aggregate>("GET", `/side-control/telemetry/aggregate?${q}`, { bearer, signal: abort.signal }).then(
      (r) => {
        data.current = { t: r.points.map((p) => p.bucket_start_time_ms), v: r.points.map((p) => p.value) };
        setProblem(undefined);
        draw();
      },
      (err: unknown) => {
        if ((err as Error)?.name === "AbortError" || sessionProblem(err)) return;
        setProblem("The chart could not be loaded.");
      },
    );
    const off = onTelemetry((values) => {
      let changed = false;
      const cutoff = Date.now() - RANGES[range].ms;
      for (const x of values) {
        if (x.field !== field || x.observed_at_unix_ms < cutoff) continue;
        const { t, v } = data.current;
        // Kept in time order (reports may arrive late).
        let i = t.length;
        while (i > 0 && (t[i - 1] as number) > x.observed_at_unix_ms) i--;
        t.splice(i, 0, x.observed_at_unix_ms);
        v.splice(i, 0, x.value);
        changed = true;
      }
      if (!changed) return;
      const { t, v } = data.current;
      while (t.length > 0 && (t[0] as number) < cutoff) {
        t.shift();
        v.shift();
      }
      draw();
    });
    return () => {
      abort.abort();
      off();
    };
  }, [field, range, bearer, reconnects]);

  const label = FIELDS[field]?.label ?? field;
  const summary = latest === undefined ? "no data in this range" : `latest ${formatValue(field, latest)}`;
  return (
    <figure class="chart" data-field={field} data-points={count}>
      <figcaption>
        <span class="chart-title">{label}</span> <span class="muted">{summary}</span>
      </figcaption>
      <div ref={box} role="img" aria-label={`${label} over the last ${RANGES[range].label.toLowerCase()}: ${count} points, ${summary}`} />
      {problem && <p class="error">{problem}</p>}
    </figure>
  );
}
