/** Files in one sandbox (`sandbox.files`). Relative paths are under the user's home
 *  (`/home/user`), as in E2B. Every call acts as that user (or the `user` it is given): it may
 *  do what the user's commands may, and files and directories made belong to that user. */

import { InvalidArgumentError, NotFoundError } from "./errors";
import { sandboxPath, type RequestBody } from "./http";
import { parseEntryInfo, parseWriteInfo, type EntryInfo, type WriteInfo } from "./models";
import type { Sandbox } from "./sandbox";
import type { Body, ENTRY_INFO, MADE, MAKE_DIR, RENAME_PATH, WRITTEN, Wire } from "./wire";

/** What `files.write` takes: text (written as UTF-8), bytes, a Blob, or a stream of bytes. */
export type WriteData = string | ArrayBuffer | ArrayBufferView | Blob | ReadableStream<Uint8Array>;

/** One file of a several-file write. */
export interface WriteEntry {
  path: string;
  data: WriteData;
}

export interface FileOpts {
  /** The account relative paths resolve under and that owns what is made (default: the
   *  sandbox's default user). */
  user?: string;
}

export interface WriteOpts extends FileOpts {
  /** Permission bits (e.g. `0o755`); 644 when absent. */
  mode?: number;
}

export class Files {
  constructor(private readonly sandbox: Sandbox) {}

  private path(rest = ""): string {
    return sandboxPath(this.sandbox.sandboxId, `/files${rest}`);
  }

  /** Reads a file: as text (UTF-8, the default), as bytes, as a Blob, or as a stream of byte
   *  chunks (for files too large to hold). */
  read(path: string, opts?: FileOpts & { format?: "text" }): Promise<string>;
  read(path: string, opts: FileOpts & { format: "bytes" }): Promise<Uint8Array>;
  read(path: string, opts: FileOpts & { format: "blob" }): Promise<Blob>;
  read(path: string, opts: FileOpts & { format: "stream" }): Promise<ReadableStream<Uint8Array>>;
  async read(
    path: string,
    opts: FileOpts & { format?: "text" | "bytes" | "blob" | "stream" } = {},
  ): Promise<string | Uint8Array | Blob | ReadableStream<Uint8Array>> {
    const format = opts.format ?? "text";
    if (!["text", "bytes", "blob", "stream"].includes(format)) {
      throw new InvalidArgumentError(`format ${JSON.stringify(format)} is not one of text, bytes, blob, stream`);
    }
    const c = { method: "GET" as const, path: this.path(), query: this.query(path, opts.user) };
    const r = await this.sandbox._http.call(c);
    if (format === "stream") {
      return r.body ?? new ReadableStream<Uint8Array>({ start: (ctl) => ctl.close() });
    }
    let bytes: Uint8Array;
    try {
      bytes = new Uint8Array(await r.arrayBuffer());
    } catch (e) {
      throw this.sandbox._http.transportError(c, e);
    }
    // The service says how long the file was when the read began; fewer bytes is a cut transfer.
    const size = Number(r.headers.get("x-file-size") ?? bytes.length);
    if (bytes.length < size) {
      throw this.sandbox._http.transportError(c, new Error(`the transfer ended after ${bytes.length} of ${size} bytes`));
    }
    if (format === "bytes") return bytes;
    if (format === "blob") return new Blob([bytes]);
    return new TextDecoder("utf-8").decode(bytes);
  }

  /**
   * Writes a file (replaced atomically), making missing parent directories, owned by the
   * user; resolves to its `WriteInfo`. Given an array of `{path, data}` instead, writes each
   * and resolves to their infos.
   */
  write(path: string, data: WriteData, opts?: WriteOpts): Promise<WriteInfo>;
  write(files: WriteEntry[], opts?: WriteOpts): Promise<WriteInfo[]>;
  async write(
    pathOrFiles: string | WriteEntry[],
    dataOrOpts?: WriteData | WriteOpts,
    maybeOpts: WriteOpts = {},
  ): Promise<WriteInfo | WriteInfo[]> {
    if (typeof pathOrFiles === "string") {
      if (dataOrOpts === undefined) throw new InvalidArgumentError(`files.write(${JSON.stringify(pathOrFiles)}) needs the data to write`);
      return this.writeOne(pathOrFiles, dataOrOpts as WriteData, maybeOpts);
    }
    if (!Array.isArray(pathOrFiles)) {
      throw new InvalidArgumentError("give a path and data, or an array of {path, data} entries");
    }
    const opts = (dataOrOpts ?? {}) as WriteOpts;
    const out: WriteInfo[] = [];
    for (const [i, e] of pathOrFiles.entries()) {
      if (typeof e?.path !== "string" || e.data === undefined || e.data === null) {
        throw new InvalidArgumentError(`entry ${i} of the files to write needs a string path and data`);
      }
      out.push(await this.writeOne(e.path, e.data, opts));
    }
    return out;
  }

  private async writeOne(path: string, data: WriteData, opts: WriteOpts): Promise<WriteInfo> {
    const owner = opts.user ?? this.sandbox.defaultUser;
    const query: Record<string, string> = { path: this.sandbox._abs(path, owner) };
    if (owner) query.user = owner;
    if (opts.mode !== undefined) query.mode = opts.mode.toString(8);
    let body: RequestBody;
    if (typeof data === "string") body = Buffer.from(data, "utf8");
    else if (data instanceof ArrayBuffer) body = new Uint8Array(data);
    else if (ArrayBuffer.isView(data)) body = new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
    else body = data;
    const d = await this.sandbox._http.json<Wire<typeof WRITTEN>>({
      method: "PUT",
      path: this.path(),
      query,
      body,
      headers: { "content-type": "application/octet-stream" },
    });
    return parseWriteInfo(d);
  }

  /** Entries of a directory. */
  async list(path: string, opts: FileOpts = {}): Promise<EntryInfo[]> {
    const d = await this.sandbox._http.json<Wire<typeof ENTRY_INFO>[]>({
      method: "GET",
      path: this.path("/list"),
      query: this.query(path, opts.user),
    });
    return d.map(parseEntryInfo);
  }

  /** Metadata of a path (a final symlink is not followed). */
  async getInfo(path: string, opts: FileOpts = {}): Promise<EntryInfo> {
    const d = await this.sandbox._http.json<Wire<typeof ENTRY_INFO>>({
      method: "GET",
      path: this.path("/stat"),
      query: this.query(path, opts.user),
    });
    return parseEntryInfo(d);
  }

  /** True when the path exists. */
  async exists(path: string, opts: FileOpts = {}): Promise<boolean> {
    try {
      await this.getInfo(path, opts);
      return true;
    } catch (e) {
      if (e instanceof NotFoundError) return false;
      throw e;
    }
  }

  /** Removes a file or a directory (with its contents unless `recursive: false`). */
  async remove(path: string, opts: FileOpts & { recursive?: boolean } = {}): Promise<void> {
    await this.sandbox._http.empty({
      method: "DELETE",
      path: this.path(),
      query: { ...this.query(path, opts.user), recursive: opts.recursive ?? true },
    });
  }

  /** Renames a path; resolves to the renamed entry. */
  async rename(oldPath: string, newPath: string, opts: FileOpts = {}): Promise<EntryInfo> {
    const owner = opts.user ?? this.sandbox.defaultUser;
    const body: Body<typeof RENAME_PATH> = {
      from: this.sandbox._abs(oldPath, owner),
      to: this.sandbox._abs(newPath, owner),
    };
    if (owner) body.user = owner;
    await this.sandbox._http.empty({ method: "POST", path: this.path("/rename"), json: body });
    return this.getInfo(body.to as string, opts);
  }

  /** The query of a call on `path` that acts as `user` (default: the sandbox's user), so it may
   *  do what that account's commands may and nothing more. */
  private query(path: string, user?: string): Record<string, string> {
    const owner = user ?? this.sandbox.defaultUser;
    const q: Record<string, string> = { path: this.sandbox._abs(path, owner) };
    if (owner) q.user = owner;
    return q;
  }

  /** Makes a directory and its parents, owned by the user; false when it existed already. */
  async makeDir(path: string, opts: FileOpts = {}): Promise<boolean> {
    const owner = opts.user ?? this.sandbox.defaultUser;
    const body: Body<typeof MAKE_DIR> = { path: this.sandbox._abs(path, owner), parents: true };
    if (owner) body.user = owner;
    const d = await this.sandbox._http.json<Wire<typeof MADE>>({ method: "POST", path: this.path("/mkdir"), json: body });
    return d.created;
  }
}
