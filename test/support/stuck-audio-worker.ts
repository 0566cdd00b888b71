/**
 * An audio thread that gets stuck once (test/voice-threads.test.ts): the real one, except that the
 * first such thread of a test loops for ever, answering nothing, once a packet carrying STUCK_MAGIC
 * reaches it. Which thread that is, across restarts, a marker file says (PERCH_TEST_STUCK_MARKER).
 */
import { existsSync, writeFileSync } from "node:fs";
import { parentPort } from "node:worker_threads";
import "../../src/voice/audio-worker.ts";

const STUCK_MAGIC = "PERCH-TEST-STUCK";

const marker = process.env.PERCH_TEST_STUCK_MARKER;
if (marker && !existsSync(marker)) {
  parentPort!.on("message", (m: { t: string; rtp?: ArrayBuffer }) => {
    if (m.t === "in" && m.rtp && Buffer.from(m.rtp).includes(STUCK_MAGIC)) {
      writeFileSync(marker, "stuck");
      for (;;) {}
    }
  });
}
