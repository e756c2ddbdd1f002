/**
 * Every failure the SDK reports: an HTTP error, a WebSocket `error` reply, a live `error`
 * event, a lost connection (`disconnected`), a checksum mismatch (`checksum`) or a malformed
 * server message (`protocol`). `code` is the server's error code (docs/api.md) or one of those.
 */
export class SluiceError extends Error {
  readonly code: string;
  readonly status?: number;
  readonly details: Record<string, unknown>;

  constructor(code: string, message: string, details: Record<string, unknown> = {}, status?: number) {
    super(message);
    this.name = "SluiceError";
    this.code = code;
    this.details = details;
    if (status !== undefined) this.status = status;
  }

  /** Builds an error from the server's `{"code","message",…}` object. */
  static from(obj: unknown, status?: number): SluiceError {
    if (obj && typeof obj === "object") {
      const { code, message, ...details } = obj as Record<string, unknown>;
      return new SluiceError(
        typeof code === "string" ? code : "protocol",
        typeof message === "string" ? message : `server error ${JSON.stringify(obj)}`,
        details,
        status,
      );
    }
    return new SluiceError("protocol", `malformed error from the server: ${String(obj)}`, {}, status);
  }
}
