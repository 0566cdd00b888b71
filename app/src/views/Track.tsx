import { useEffect, useRef, useState } from "preact/hooks";
import { request } from "../api.ts";
import { sessionProblem } from "../live.ts";
import { connectedCount, onTelemetry } from "../state.ts";
import { RANGES, type Range } from "./Chart.tsx";

const W = 320;
const H = 220;
const PAD = 16;
const EARTH_M = 40_075_016.686;
const TILE = 256;

interface Point {
  t: number;
  lat: number;
  lon: number;
}

/** Web Mercator at zoom 0 (a 256-unit world), so that tiles, when there are any, line up. */
function project(lat: number, lon: number): [number, number] {
  const s = Math.sin((Math.max(-85, Math.min(85, lat)) * Math.PI) / 180);
  return [((lon + 180) / 360) * TILE, (0.5 - Math.log((1 + s) / (1 - s)) / (4 * Math.PI)) * TILE];
}

const tileUrl = () => document.querySelector<HTMLMetaElement>('meta[name="perch-tile-url"]')?.content;

interface Range2 {
  points: Array<{ observed_at_unix_ms: number; value: number }>;
}

/** Latitude and longitude samples of the same observation, joined by time. */
function join(lat: Range2, lon: Range2): Point[] {
  const lons = new Map(lon.points.map((p) => [p.observed_at_unix_ms, p.value]));
  return lat.points.flatMap((p) => {
    const l = lons.get(p.observed_at_unix_ms);
    return l === undefined ? [] : [{ t: p.observed_at_unix_ms, lat: p.value, lon: l }];
  });
}

function niceStep(metersPerUnit: number): number {
  const target = 60 * metersPerUnit;
  const steps = [1, 2, 5];
  for (let e = 0; e < 8; e++) for (const s of steps) if (s * 10 ** e >= target) return s * 10 ** e;
  return 10 ** 8;
}

/**
 * The GNSS track over the range, drawn as SVG on a local grid (no network needed); with map
 * tiles beneath only when the operator configured a tile URL.
 */
export function Track({ range, bearer }: { range: Range; bearer: string }) {
  const [points, setPoints] = useState<Point[]>([]);
  const pending = useRef(new Map<number, { lat?: number; lon?: number }>());
  const reconnects = connectedCount.value;

  useEffect(() => {
    const abort = new AbortController();
    const end = Date.now() + 1;
    const start = end - RANGES[range].ms;
    const q = (field: string) =>
      `/side-control/telemetry?${new URLSearchParams({ field, start_time_ms: String(start), end_time_ms: String(end), limit: "1000", order: "desc" })}`;
    Promise.all([
      request<Range2>("GET", q("gnss.latitude"), { bearer, signal: abort.signal }),
      request<Range2>("GET", q("gnss.longitude"), { bearer, signal: abort.signal }),
    ]).then(
      ([lat, lon]) => setPoints(join(lat, lon).reverse()),
      (err: unknown) => {
        if ((err as Error)?.name !== "AbortError") sessionProblem(err);
      },
    );
    const off = onTelemetry((values) => {
      const added: Point[] = [];
      for (const v of values) {
        if (v.field !== "gnss.latitude" && v.field !== "gnss.longitude") continue;
        const p = pending.current.get(v.observed_at_unix_ms) ?? {};
        if (v.field === "gnss.latitude") p.lat = v.value;
        else p.lon = v.value;
        if (p.lat !== undefined && p.lon !== undefined) {
          added.push({ t: v.observed_at_unix_ms, lat: p.lat, lon: p.lon });
          pending.current.delete(v.observed_at_unix_ms);
        } else pending.current.set(v.observed_at_unix_ms, p);
      }
      if (pending.current.size > 100) pending.current.clear();
      if (added.length > 0) setPoints((old) => [...old, ...added].sort((a, b) => a.t - b.t).slice(-2000));
    });
    return () => {
      abort.abort();
      off();
    };
  }, [range, bearer, reconnects]);

  if (points.length === 0) {
    return (
      <figure class="track">
        <figcaption>
          <span class="chart-title">Track</span> <span class="muted">no positions in this range</span>
        </figcaption>
      </figure>
    );
  }

  const xy = points.map((p) => project(p.lat, p.lon));
  const xs = xy.map((p) => p[0]);
  const ys = xy.map((p) => p[1]);
  const [minX, maxX, minY, maxY] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  const tiles = tileUrl();
  // Units per zoom-0 unit: fits the track, at most street level (zoom 19).
  let scale = Math.min((W - 2 * PAD) / Math.max(maxX - minX, 1e-9), (H - 2 * PAD) / Math.max(maxY - minY, 1e-9), 2 ** 19);
  if (tiles) scale = 2 ** Math.max(0, Math.min(19, Math.floor(Math.log2(scale))));
  const cx = (minX + maxX) / 2;
  const cy = (minY + maxY) / 2;
  const toSvg = ([x, y]: [number, number]): [number, number] => [W / 2 + (x - cx) * scale, H / 2 + (y - cy) * scale];
  const path = xy.map(toSvg);
  const last = points.at(-1) as Point;
  const first = path[0] as [number, number];
  const end = path.at(-1) as [number, number];
  const metersPerUnit = (EARTH_M * Math.cos((last.lat * Math.PI) / 180)) / TILE / scale;
  const step = niceStep(metersPerUnit);
  const stepUnits = step / metersPerUnit;
  const grid: preact.JSX.Element[] = [];
  for (let x = (((W / 2) % stepUnits) + stepUnits) % stepUnits; x < W; x += stepUnits) grid.push(<line key={`x${x}`} x1={x} y1={0} x2={x} y2={H} />);
  for (let y = (((H / 2) % stepUnits) + stepUnits) % stepUnits; y < H; y += stepUnits) grid.push(<line key={`y${y}`} x1={0} y1={y} x2={W} y2={y} />);

  const images: preact.JSX.Element[] = [];
  if (tiles) {
    const z = Math.round(Math.log2(scale));
    const n = 2 ** z;
    const left = cx * scale - W / 2;
    const top = cy * scale - H / 2;
    for (let tx = Math.floor(left / TILE); tx * TILE < left + W; tx++) {
      for (let ty = Math.floor(top / TILE); ty * TILE < top + H; ty++) {
        if (ty < 0 || ty >= n) continue;
        const wx = ((tx % n) + n) % n;
        const href = tiles.replace("{z}", String(z)).replace("{x}", String(wx)).replace("{y}", String(ty));
        images.push(<image key={`${tx}/${ty}`} href={href} x={tx * TILE - left} y={ty * TILE - top} width={TILE} height={TILE} />);
      }
    }
  }
  const distance = step >= 1000 ? `${step / 1000} km` : `${step} m`;
  return (
    <figure class="track">
      <figcaption>
        <span class="chart-title">Track</span>{" "}
        <span class="muted">
          {points.length} positions; grid {distance}
        </span>
      </figcaption>
      <svg
        viewBox={`0 0 ${W} ${H}`}
        role="img"
        aria-label={`GNSS track: ${points.length} positions, latest ${last.lat.toFixed(5)}, ${last.lon.toFixed(5)}; grid lines every ${distance}`}
      >
        <rect class="track-bg" x={0} y={0} width={W} height={H} />
        {images}
        <g class="track-grid">{grid}</g>
        <polyline class="track-line" points={path.map(([x, y]) => `${x.toFixed(1)},${y.toFixed(1)}`).join(" ")} />
        <circle class="track-start" cx={first[0]} cy={first[1]} r={4} />
        <circle class="track-end" cx={end[0]} cy={end[1]} r={6} />
      </svg>
    </figure>
  );
}
