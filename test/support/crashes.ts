/** Records what would end the process (uncaught exceptions, unhandled rejections) until `stop()`. */
export function watchCrashes(): { errors: unknown[]; stop(): void } {
  const errors: unknown[] = [];
  const record = (err: unknown) => errors.push(err);
  process.on("uncaughtException", record);
  process.on("unhandledRejection", record);
  return {
    errors,
    stop() {
      process.off("uncaughtException", record);
      process.off("unhandledRejection", record);
    },
  };
}
