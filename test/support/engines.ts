import { embeddedEngines } from "../../src/server.ts";

/**
 * The engines of the test servers and of the tests that use them directly: one recogniser process
 * and Moonshine base only, whatever the machine (the suite runs three files at once on 2 cores; a
 * loaded machine must not turn a test's words into tiny's). The engine tests cover the rest.
 */
export const TEST_ENGINES = { recogniser_processes: 1, fast_recognition_after_ms: false } as const;

/** The embedded speech engines the servers of this test process share (one pair per process). */
export const engines = () => embeddedEngines(TEST_ENGINES);

/** Loads the recogniser's models before a test's first question: on a loaded machine their first load outlasts the detector's 4 s backlog. */
export async function warmRecogniser(): Promise<void> {
  await engines().transcription?.start?.();
}
