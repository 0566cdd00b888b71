import type { Store } from "../../src/store/index.ts";

/** A telemetry frame with one battery observation at `at`. */
export const battery = (at: number, percent = 50) => ({
  observedAtUnixMs: BigInt(at),
  observations: [{ observedAtDeltaMs: 0, body: { case: "battery" as const, value: { percent } } }],
});

/** The telemetry counters of a node's /metrics: frames stored, and dropped by reason. */
export async function counters(url: string): Promise<{ stored: number; dropped: Record<string, number> }> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const dropped: Record<string, number> = {};
  for (const m of text.matchAll(/^perch_telemetry_frames_dropped_total\{reason="(\w+)"\} (\d+)/gm)) dropped[m[1]!] = Number(m[2]);
  return { stored: Number(/^perch_telemetry_frames_total (\d+)/m.exec(text)?.[1] ?? 0), dropped };
}

/** Stored battery samples of `publicKey` over the last day. */
export async function storedSamples(store: Store, publicKey: string): Promise<number> {
  const now = Date.now();
  const range = await store.read((r) =>
    r.telemetry.range({ publicKey, field: "battery.percent", start: now - 86_400_000, end: now + 1, order: "asc", limit: 100_000 }),
  );
  return range.length;
}
