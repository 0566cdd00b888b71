import type { Command } from "commander";
import type { KeyPair } from "../crypto/keys.ts";
import { DEMO_TOOLS } from "./demo-tools.ts";

export interface ConnectOptions {
  telemetryInterval: string;
  manufacturer?: string;
  model?: string;
  hardwareRevision?: string;
  sn?: string;
  name?: string;
  emoji?: string;
  tone?: boolean;
  battery: string;
  say?: string;
  voice: string;
  replyWav?: string;
  tool: string[];
}

/** The voice `--say` speaks with by default: one the embedded recogniser hears well (test/tour-questions.test.ts). */
export const SAY_VOICE = "onyx";

/**
 * `perch device connect`: a device from the terminal over WebRTC. It reports telemetry every N
 * seconds, answers `client.*` from flags (−32601 for what no flag gives) and stays until Ctrl-C.
 */

export function registerConnectCommand(device: Command, load: () => { server: string; keyPair: KeyPair }, fail: (message: string) => never): void {
  device
    .command("connect")
    .description("connect over WebRTC as the device, report telemetry and answer RPCs until Ctrl-C")
    .option("--telemetry-interval <seconds>", "seconds between telemetry frames (0: none)", "10")
    .option("--battery <percent>", "the battery level reported", "80")
    .option("--manufacturer <text>", "answer client.info.get with this manufacturer")
    .option("--model <text>", "answer client.info.get with this model")
    .option("--hardware-revision <text>", "answer client.info.get with this revision")
    .option("--sn <text>", "answer client.identifiers.get with this serial number")
    .option("--name <text>", "set the device's name with server.info.put")
    .option("--emoji <text>", "set the device's emoji with server.info.put")
    .option("--tone", "ask the server for a test tone and report the audio received")
    .option("--say <text>", "speak this (synthesised) into the microphone, print the conversation's events, and leave after the reply")
    .option(
      "--voice <name>",
      "the voice --say speaks with (alloy, echo, fable, onyx, nova, shimmer); the default is one the embedded recogniser hears well",
      SAY_VOICE,
    )
    .option("--reply-wav <file>", "with --say: save what the device heard as a WAV file")
    .option(
      "--tool <name>",
      `offer a demo tool to the server's agents over service stream 3 (${Object.keys(DEMO_TOOLS).join(", ")}); repeatable`,
      (v: string, all: string[]) => [...all, v],
      [],
    )
    .action(async (opts: ConnectOptions) => {
      // The device SDK (WebRTC, protocol buffers, MCP) is loaded only by this command.
      const { runConnect } = await import("./device-connect-run.ts");
      await runConnect(opts, load, fail);
    });
}
