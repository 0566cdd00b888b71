import type { DeviceTool } from "../sdk/tools.ts";

/** What a demo tool reports of the device: merged into its status document (`PUT /me/status`), so the phone shows it. */
export type ReportStatus = (patch: Record<string, unknown>) => Promise<void>;

/** The demo tools `--tool` offers, each given the terminal's printer and the status reporter. */
export const DEMO_TOOLS: Record<string, (say: (what: string, detail?: Record<string, unknown>) => void, report: ReportStatus) => DeviceTool[]> = {
  volume: (say, report) => {
    // The device's volume, kept in memory: what a speaker's firmware would set.
    let level = 5;
    say("volume", { level });
    return [
      {
        name: "set_volume",
        description: "Sets the device's speaker volume, from 0 (silent) to 10 (loudest).",
        inputSchema: { type: "object", properties: { level: { type: "integer", minimum: 0, maximum: 10 } }, required: ["level"] },
        handler: async (args) => {
          level = args.level as number;
          say("volume set", { level });
          // The status document's volume is a percentage.
          await report({ volume: level * 10 }).then(
            () => say("status reported", { volume: level * 10 }),
            (err: unknown) => say("status not reported", { error: (err as Error).message }),
          );
          return `The volume is now ${level}.`;
        },
      },
      {
        name: "get_volume",
        description: "The device's speaker volume now, from 0 (silent) to 10 (loudest).",
        inputSchema: { type: "object", properties: {} },
        handler: () => `The volume is ${level}.`,
      },
    ];
  },
};
