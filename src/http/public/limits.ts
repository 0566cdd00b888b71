import { ApiError } from "../errors.ts";
import { asMiddleware, bodyLimitGuard } from "../native.ts";

/** The Public API's request body limit on JSON routes (the offer route will take 256 KiB). */
export const JSON_BODY_LIMIT = 64 * 1024;

/** The refusal of a body over `JSON_BODY_LIMIT`. */
export const payloadTooLarge = () => new ApiError(413, "PAYLOAD_TOO_LARGE", `request body is over ${JSON_BODY_LIMIT} bytes`);

/** The first check of every Public API route: 413 `PAYLOAD_TOO_LARGE` over `JSON_BODY_LIMIT`. */
export const publicBodyLimit = bodyLimitGuard(JSON_BODY_LIMIT, payloadTooLarge);

/** `publicBodyLimit` as the first middleware of a Public API route's object (a native route runs it as a guard). */
export const jsonBodyLimit = asMiddleware(publicBodyLimit);
