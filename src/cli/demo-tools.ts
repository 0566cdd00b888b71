import type { DeviceTool } from "../sdk/tools.ts";

/** The demo tools `--tool` offers, each given the terminal's printer. */
export const DEMO_TOOLS: Record<string, (say: (what: string, detail?: Record<string, unknown>) => void) => DeviceTool[]> = {
  volume: (say) => {
    // The device's volume, kept in memory: what a speaker's firmware would set.
    let level = 5;
    say("volume", { level });
    return [
      {
        name: "set_volume",
        description: "Sets the device's speaker volume, from 0 (silent) to 10 (loudest).",
        inputSchema: { type: "object", properties: { level: { type: "integer", minimum: 0, maximum: 10 } }, required: ["level"] },
        handler: (args) => {
          level = args.level as number;
          say("volume set", { level });
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
