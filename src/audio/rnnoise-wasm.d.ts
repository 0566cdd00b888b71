declare module "@echogarden/rnnoise-wasm" {
  interface RNNoiseModule {
    HEAPF32: Float32Array;
    _malloc(bytes: number): number;
    _free(ptr: number): void;
    /** A denoiser's state; `model` 0: the weights built in. */
    _rnnoise_create(model: number): number;
    _rnnoise_destroy(state: number): void;
    _rnnoise_get_frame_size(): number;
    /** Denoises one frame (480 floats at 48 kHz, 16-bit scale) from `inPtr` into `outPtr`; returns its voice probability. */
    _rnnoise_process_frame(state: number, outPtr: number, inPtr: number): number;
  }
  const factory: (options?: Record<string, unknown>) => Promise<RNNoiseModule>;
  export default factory;
  export type { RNNoiseModule };
}
