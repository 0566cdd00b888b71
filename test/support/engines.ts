import { EngineHost } from "../../src/server.ts";

/**
 * The engines of the test servers and of the tests that use them directly: one recogniser process
 * and Moonshine base only, whatever the machine (the suite runs three files at once on 2 cores; a
 * loaded machine must not turn a test's words into tiny's). The engine tests cover the rest.
 */
export const TEST_ENGINES = { recogniser_processes: 1, fast_recognition_after_ms: false } as const;

let shared: ReturnType<typeof EngineHost.embedded> | undefined;

/**
 * The engine host the servers of this test process share, on purpose (each node would otherwise
 * start its own engines and load the recogniser's models again): `startTestServer` passes it.
 */
export const engines = () => {
  shared ??= EngineHost.embedded(TEST_ENGINES);
  return shared;
};

/** Loads the recogniser's models before a test's first question: on a loaded machine their first load outlasts the detector's 4 s backlog. */
export async function warmRecogniser(): Promise<void> {
  await engines().transcription?.start?.();
}
