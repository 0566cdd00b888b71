/**
 * An audio thread that gets stuck once (test/voice-threads.test.ts): the real one, except that the
 * first such thread of a test, after its 5th batch of packets, loops for ever without answering.
 * Which thread that is, across restarts, a marker file says (PERCH_TEST_STUCK_MARKER).
 */
import { existsSync, writeFileSync } from "node:fs";
import { parentPort } from "node:worker_threads";
import "../../src/voice/audio-worker.ts";

const marker = process.env.PERCH_TEST_STUCK_MARKER;
if (marker && !existsSync(marker)) {
  writeFileSync(marker, "stuck");
  let batches = 0;
  parentPort!.on("message", (m: { t: string; rtp?: ArrayBuffer }) => {
    if (m.t === "in" && m.rtp && ++batches === 5) for (;;) {}
  });
}
