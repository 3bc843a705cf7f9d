/** The server-sent events of a streamed command (`POST .../commands/stream`): `stdout` and
 *  `stderr` events carry `{"data": base64}`, then one `exit` or `error` event ends it. */

import { BranchboxError, fromCode, type CommandResult } from "./errors";
import { parseCommandResult } from "./models";
import type { ExitEvent } from "./wire";

export type OutputCallback = (data: string) => void | Promise<void>;

/** Turns the event stream into callbacks (UTF-8 decoded as it arrives) and a result. */
export class StreamDecoder {
  private readonly text = { stdout: [] as string[], stderr: [] as string[] };
  private readonly decoders = { stdout: new TextDecoder("utf-8"), stderr: new TextDecoder("utf-8") };
  private event = "message";
  private data: string[] = [];
  private pending = "";
  private result: CommandResult | undefined;
  private readonly lines = new TextDecoder("utf-8");

  constructor(private readonly callbacks: { stdout?: OutputCallback; stderr?: OutputCallback }) {}

  private async emit(name: "stdout" | "stderr", text: string): Promise<void> {
    if (!text) return;
    this.text[name].push(text);
    await this.callbacks[name]?.(text);
  }

  private async dispatch(): Promise<void> {
    const event = this.event;
    const data = this.data.join("\n");
    this.event = "message";
    this.data = [];
    if (!data) return;
    const payload = JSON.parse(data) as { data?: string; error?: { code?: string; message?: string } } & ExitEvent;
    if (event === "stdout" || event === "stderr") {
      const bytes = Buffer.from(payload.data ?? "", "base64");
      await this.emit(event, this.decoders[event].decode(bytes, { stream: true }));
    } else if (event === "exit") {
      for (const name of ["stdout", "stderr"] as const) await this.emit(name, this.decoders[name].decode());
      this.result = parseCommandResult(payload, this.text.stdout.join(""), this.text.stderr.join(""));
    } else if (event === "error") {
      throw fromCode(payload.error?.code, payload.error?.message ?? "the command failed");
    }
  }

  private async line(line: string): Promise<void> {
    if (line === "") await this.dispatch();
    else if (line.startsWith(":")) return;
    else if (line.startsWith("event:")) this.event = line.slice(6).trim();
    else if (line.startsWith("data:")) this.data.push(line.slice(5).replace(/^ /, ""));
  }

  /** Feeds a chunk of the body as it arrives. */
  async feed(chunk: Uint8Array): Promise<void> {
    this.pending += this.lines.decode(chunk, { stream: true });
    let i: number;
    while ((i = this.pending.indexOf("\n")) >= 0) {
      const line = this.pending.slice(0, i).replace(/\r$/, "");
      this.pending = this.pending.slice(i + 1);
      await this.line(line);
    }
  }

  /** The result, once the stream ended. */
  async finish(): Promise<CommandResult> {
    this.pending += this.lines.decode();
    if (this.pending) await this.line(this.pending.replace(/\r$/, ""));
    this.pending = "";
    await this.dispatch();
    if (this.result === undefined) {
      throw new BranchboxError("the command's output stream ended before its exit status", { code: "stream_cut" });
    }
    return this.result;
  }
}
