/** An audio thread that cannot start (its module fails as it loads): test/voice-threads.test.ts. */
throw new Error("this audio thread cannot start");
