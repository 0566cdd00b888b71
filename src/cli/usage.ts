import type { Command } from "commander";
import type { KeyLimitConfig } from "../config/config.ts";
import type { Domain } from "../domain/index.ts";
import type { UsageRow } from "../store/usage.ts";

type WithDomain = <T>(fn: (domain: Domain) => Promise<T>) => Promise<T>;
type Io = { keyArg: (text: string) => string; fail: (message: string) => never; print: (value: unknown) => void; withDomain: WithDomain };

const COUNTERS = ["requests", "tokens", "speech-chars", "audio-seconds"] as const;
const FIELD = { requests: "requests", tokens: "tokens", "speech-chars": "speech_chars", "audio-seconds": "audio_seconds" } as const;

/** Days `perch usage` may look back: far past any retention, short of what a date can say. */
const MAX_DAYS = 100_000;

function count(text: string): number {
  // Past 2^53 a value would be stored and then read back as no limits at all.
  if (!/^\d+$/.test(text) || !Number.isSafeInteger(Number(text))) throw new Error(`not a whole number: ${text}`);
  return Number(text);
}

/** A row as the report shows it: the principal as the operator names it, audio in seconds. */
function shown(r: UsageRow) {
  const device = r.principal.startsWith("device:");
  return {
    day: r.day,
    ...(device ? { device: r.principal.slice(7) } : { api_key_id: r.principal.slice(8) }),
    agent: r.agent,
    requests: r.requests,
    input_tokens: r.input_tokens,
    output_tokens: r.output_tokens,
    speech_chars: r.speech_chars,
    audio_seconds: r.audio_ms / 1000,
    tool_calls: r.tool_calls,
    estimated: r.estimated === 1,
  };
}

function table(rows: ReturnType<typeof shown>[]): string {
  const head = ["day", "who", "agent", "requests", "in tokens", "out tokens", "speech chars", "audio s", "tool calls"];
  const lines = rows.map((r) => [
    r.day,
    "device" in r ? `device ${r.device}` : `api key ${r.api_key_id}`,
    r.agent,
    String(r.requests),
    `${r.input_tokens}${r.estimated ? "~" : ""}`,
    `${r.output_tokens}${r.estimated ? "~" : ""}`,
    String(r.speech_chars),
    r.audio_seconds.toFixed(1),
    String(r.tool_calls),
  ]);
  const widths = head.map((h, i) => Math.max(h.length, ...lines.map((l) => l[i]!.length)));
  const fmt = (cells: string[]) =>
    cells
      .map((c, i) => c.padEnd(widths[i]!))
      .join("  ")
      .trimEnd();
  const note = rows.some((r) => r.estimated) ? "\n~ estimated: the provider reported no usage" : "";
  return `${[fmt(head), ...lines.map(fmt)].join("\n")}${note}`;
}

/** `perch usage` and `perch peers limits` (usage.md §2–3). */
export function registerUsageCommands(program: Command, peers: Command, io: Io): void {
  program
    .command("usage")
    .description("what devices and API keys used, per UTC day and agent or model (newest first)")
    .option("--key <key>", "only this device")
    .option("--api-key-id <id>", "only this API key (its name in api_keys)")
    .option("--days <n>", "days back, today included", "7")
    .option("--json", "print JSON")
    .action((opts: { key?: string; apiKeyId?: string; days: string; json?: boolean }) =>
      io.withDomain(async (d) => {
        const days =
          /^\d+$/.test(opts.days) && Number(opts.days) >= 1 && Number(opts.days) <= MAX_DAYS
            ? Number(opts.days)
            : io.fail(`--days takes a whole number of days from 1 to ${MAX_DAYS}: ${opts.days}`);
        if (opts.key !== undefined && opts.apiKeyId !== undefined) io.fail("give --key or --api-key-id, not both");
        const key = opts.key === undefined ? undefined : io.keyArg(opts.key);
        if (key !== undefined && (await d.peers.voiceAgent(key)) === undefined) io.fail(`no registered peer ${opts.key}`);
        if (opts.apiKeyId !== undefined && !d.ctx.config.api_keys.some((k) => k.name === opts.apiKeyId)) io.fail(`no API key ${opts.apiKeyId} in api_keys`);
        const rows = (
          await d.usage.report({ ...(key !== undefined ? { key } : {}), ...(opts.apiKeyId !== undefined ? { apiKeyId: opts.apiKeyId } : {}), days })
        )
          .filter((r) => r.principal !== "all_devices")
          .map(shown);
        if (opts.json) io.print(rows);
        else process.stdout.write(rows.length ? `${table(rows)}\n` : "no usage\n");
      }),
    );

  const limits = peers
    .command("limits <key>")
    .description(
      "set the device's own usage limits, which replace the configured `device` limits for it (0: none allowed); --clear goes back to the configured ones; with no option, print them",
    )
    .option("--clear", "remove the device's own limits");
  for (const c of COUNTERS)
    for (const per of ["day", "month"] as const) limits.option(`--${c}-per-${per} <n>`, `${FIELD[c].replace("_", " ")} a ${per} at most`);
  limits.action((keyText: string, opts: Record<string, string | boolean | undefined>) =>
    io.withDomain(async (d) => {
      const key = io.keyArg(keyText);
      const list: KeyLimitConfig[] = [];
      try {
        for (const per of ["day", "month"] as const) {
          const entry: KeyLimitConfig = { per };
          for (const c of COUNTERS) {
            const name = `${c}Per${per === "day" ? "Day" : "Month"}`.replace(/-(\w)/g, (_, x: string) => x.toUpperCase());
            const v = opts[name];
            if (typeof v === "string") entry[FIELD[c]] = count(v);
          }
          if (Object.keys(entry).length > 1) list.push(entry);
        }
      } catch (err) {
        io.fail((err as Error).message);
      }
      if (opts.clear && list.length > 0) io.fail("--clear takes no limits");
      if (!opts.clear && list.length === 0) {
        if ((await d.peers.voiceAgent(key)) === undefined) io.fail(`no registered peer ${keyText}`);
        io.print({ public_key: key, limits: await d.usage.deviceLimits(key), usage: await d.usage.view(key) });
        return;
      }
      try {
        await d.usage.setDeviceLimits(key, opts.clear ? null : list);
      } catch {
        io.fail(`no registered peer ${keyText}`);
      }
      io.print({ public_key: key, limits: opts.clear ? null : list });
    }),
  );
}
