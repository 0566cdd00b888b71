declare module "@echogarden/speex-resampler-wasm" {
  interface SpeexModule {
    HEAPU8: Uint8Array;
    HEAP16: Int16Array;
    HEAPU32: Uint32Array;
    HEAPF32: Float32Array;
    _malloc(bytes: number): number;
    _free(ptr: number): void;
    _speex_resampler_init(channels: number, inRate: number, outRate: number, quality: number, errPtr: number): number;
    _speex_resampler_destroy(state: number): void;
    _speex_resampler_process_int(state: number, channel: number, inPtr: number, inLenPtr: number, outPtr: number, outLenPtr: number): number;
    _speex_resampler_process_float(state: number, channel: number, inPtr: number, inLenPtr: number, outPtr: number, outLenPtr: number): number;
    _speex_resampler_skip_zeros(state: number): number;
    _speex_resampler_get_input_latency(state: number): number;
  }
  const factory: (options?: Record<string, unknown>) => Promise<SpeexModule>;
  export default factory;
  export type { SpeexModule };
}
