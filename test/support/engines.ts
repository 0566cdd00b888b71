import { embeddedEngines } from "../../src/server.ts";

/** The embedded speech engines the servers of this test process share (one pair per process). */
export { embeddedEngines as engines };

/** Loads the recogniser's models before a test's first question: on a loaded machine their first load outlasts the detector's 4 s backlog. */
export async function warmRecogniser(): Promise<void> {
  await embeddedEngines().transcription?.start?.();
}
