/**
 * A small typed Threadloom client to copy: queries and mutations over `fetch`, subscriptions over a
 * `graphql-transport-ws` WebSocket (graphql-ws, with the `ws` package since Node 20 has no global
 * WebSocket). Every operation is a typed document generated from `operations.graphql` and the
 * schema, so variables and results are checked by `tsc`.
 *
 * A subscription yields `ThreadEvent`s; resume after a disconnect by passing the last `sequence`
 * you saw as `after`: the server replays exactly the events you missed, then sends one
 * `synchronized` item, then streams live.
 */
import type { TypedDocumentNode } from "@graphql-typed-document-node/core";
import { print, type GraphQLFormattedError } from "graphql";
import { createClient, type Client as SocketClient } from "graphql-ws";
import WebSocket from "ws";

import {
  ArchiveProjectDocument,
  CreateProjectDocument,
  CreateThreadDocument,
  ForkThreadDocument,
  PendingRequestsDocument,
  RespondToApprovalDocument,
  RunDocument,
  RunGraphDocument,
  SendMessageDocument,
  ThreadActivitiesDocument,
  ThreadDocument,
  ThreadEventsDocument,
  type Decision,
  type ForkThreadMutation,
  type RunGraphQuery,
  type RunStatus,
  type ThreadActivitiesQuery,
  type ThreadEventsSubscription,
} from "./generated/graphql.js";

export type ThreadEvent = ThreadEventsSubscription["threadEvents"];
export type Thread = { id: string; title: string; latestSequence: number };
export type Run = { id: string; status: RunStatus };
export type PendingRequest = { id: string; kind: string; command: string | null };

/** A fork: the new thread and the FORK transfer, whose `source` is a TransferPoint (a union). */
export type Fork = { threadId: string; transfer: NonNullable<ForkThreadMutation["forkThread"]["transfer"]> };
export type TransferPoint = NonNullable<Fork["transfer"]["source"]>;
/** A run with its thread, attempts and the handoff it received (`contextHandoff`, null when none). */
export type RunGraph = NonNullable<RunGraphQuery["run"]>;
export type Activity = NonNullable<ThreadActivitiesQuery["thread"]>["activities"]["nodes"][number];

export const TERMINAL: ReadonlySet<RunStatus> = new Set<RunStatus>([
  "COMPLETED",
  "FAILED",
  "INTERRUPTED",
  "CANCELLED",
  "ROLLED_BACK",
]);

type Variables = Record<string, unknown>;
type UserError = { code: string; message: string };

/** A top-level GraphQL error, a mutation's userErrors, or a refused connection; `code` is the stable code. */
export class ThreadloomError extends Error {
  override readonly name = "ThreadloomError";
  readonly code: string | undefined;

  constructor(
    message: string,
    readonly errors: ReadonlyArray<GraphQLFormattedError | UserError> = [],
  ) {
    super(message);
    const first = errors[0];
    const code = first && ("code" in first ? first.code : first.extensions?.["code"]);
    this.code = typeof code === "string" ? code : undefined;
  }

  static of(errors: ReadonlyArray<GraphQLFormattedError | UserError>): ThreadloomError {
    return new ThreadloomError(errors.map((e) => e.message).join("; "), errors);
  }
}

/** The payload, or a ThreadloomError when the mutation answered with userErrors. */
function ok<T extends { userErrors: UserError[] }>(payload: T): T {
  if (payload.userErrors.length > 0) throw ThreadloomError.of(payload.userErrors);
  return payload;
}

/** The value; null here means the server broke its promise, so say what was missing. */
function present<T>(value: T | null | undefined, what: string): T {
  if (value === null || value === undefined) throw new ThreadloomError(`no ${what} in the answer`);
  return value;
}

/** The run's new status when this event is an update of that run. */
export function runStatus(event: ThreadEvent, runId: string): RunStatus | null {
  const entity = event.entity;
  return entity?.__typename === "Run" && entity.id === runId ? entity.status : null;
}

export class ThreadloomClient {
  private socket: SocketClient | null = null;

  constructor(
    readonly url: string,
    private readonly token: string,
  ) {}

  /** One query or mutation over HTTP: a POST with the token in `authorization`. */
  async request<TData, TVars extends Variables>(
    document: TypedDocumentNode<TData, TVars>,
    variables: TVars,
  ): Promise<TData> {
    const response = await fetch(this.url, {
      method: "POST",
      headers: { authorization: `Bearer ${this.token}`, "content-type": "application/json" },
      body: JSON.stringify({ query: print(document), variables }),
    });
    if (!(response.headers.get("content-type") ?? "").includes("json")) {
      throw new ThreadloomError(`HTTP ${response.status}: ${await response.text()}`);
    }
    const body = (await response.json()) as { data?: TData | null; errors?: GraphQLFormattedError[] };
    if (body.errors?.length) throw ThreadloomError.of(body.errors);
    return present(body.data, "data");
  }

  /**
   * A subscription over the WebSocket: replay, `synchronized`, then live results until the caller
   * stops iterating (`break` unsubscribes). The socket opens on first use and is shared.
   */
  async *subscribe<TData, TVars extends Variables>(
    document: TypedDocumentNode<TData, TVars>,
    variables: TVars,
  ): AsyncGenerator<TData> {
    const results = this.connection().iterate<TData>({ query: print(document), variables });
    try {
      for await (const result of results) {
        if (result.errors?.length) throw ThreadloomError.of(result.errors);
        yield present(result.data, "data");
      }
    } catch (error) {
      throw error instanceof Error ? error : closed(error);
    } // leaving the loop early (break, throw) returns `results`, which unsubscribes
  }

  /** Closes the WebSocket (ending its subscriptions); the next subscription opens a new one. */
  async disconnect(): Promise<void> {
    const socket = this.socket;
    this.socket = null;
    await socket?.dispose();
  }

  private connection(): SocketClient {
    this.socket ??= createClient({
      url: this.url.replace(/^http/, "ws"), // http → ws, https → wss
      webSocketImpl: WebSocket, // Node 20 has no global WebSocket; in a browser drop this and the `ws` import
      connectionParams: { authorization: `Bearer ${this.token}` }, // the connection_init payload
      retryAttempts: 0, // an example should fail loudly; an app may prefer retries and resume
    });
    return this.socket;
  }

  async createProject(name: string, workspaceRoot: string): Promise<string> {
    const data = await this.request(CreateProjectDocument, { name, root: workspaceRoot });
    return present(ok(data.createProject).project, "project").id;
  }

  /** Archive a project (admin scope): it leaves `projects` and takes no more runs; nothing is deleted. */
  async archiveProject(projectId: string): Promise<void> {
    ok((await this.request(ArchiveProjectDocument, { projectId })).archiveProject);
  }

  async createThread(projectId: string, title: string): Promise<Thread> {
    const data = await this.request(CreateThreadDocument, { projectId, title });
    return present(ok(data.createThread).thread, "thread");
  }

  async thread(threadId: string): Promise<Thread> {
    return present((await this.request(ThreadDocument, { threadId })).thread, `thread ${threadId}`);
  }

  async sendMessage(threadId: string, text: string): Promise<Run> {
    const data = await this.request(SendMessageDocument, { threadId, text });
    return present(ok(data.sendMessage).run, "run");
  }

  async run(runId: string): Promise<Run> {
    return present((await this.request(RunDocument, { runId })).run, `run ${runId}`);
  }

  async pendingRequests(threadId: string): Promise<PendingRequest[]> {
    const thread = present((await this.request(PendingRequestsDocument, { threadId })).thread, `thread ${threadId}`);
    return thread.pendingRequests.map((r) => ({ id: r.id, kind: r.kind, command: command(r.payload) }));
  }

  async respondToApproval(requestId: string, decision: Decision): Promise<string> {
    const data = await this.request(RespondToApprovalDocument, { requestId, decision });
    return present(ok(data.respondToApproval).request, "request").status;
  }

  /** A new thread forked at a completed run, working in the project's folder (workspace SHARED). */
  async forkThread(runId: string, title: string): Promise<Fork> {
    const data = ok((await this.request(ForkThreadDocument, { runId, title })).forkThread);
    return { threadId: present(data.thread, "thread").id, transfer: present(data.transfer, "transfer") };
  }

  /** One document from a run to its thread, attempts and handoff: no second query for an id. */
  async runGraph(runId: string): Promise<RunGraph> {
    return present((await this.request(RunGraphDocument, { runId })).run, `run ${runId}`);
  }

  /** The thread's first 100 activities (of one run when `runId` is given), each with its run. */
  async activities(threadId: string, runId: string | null = null): Promise<Activity[]> {
    const data = await this.request(ThreadActivitiesDocument, { threadId, runId });
    const thread = present(data.thread, `thread ${threadId}`);
    return thread.activities.nodes;
  }

  /** The thread's events after `after` (all when null), then `synchronized`, then live. */
  async *threadEvents(threadId: string, after: number | null = null): AsyncGenerator<ThreadEvent> {
    for await (const data of this.subscribe(ThreadEventsDocument, { threadId, after })) {
      yield data.threadEvents;
    }
  }
}

/** An approval's command, from its JSON payload (`unknown` until looked at). */
function command(payload: unknown): string | null {
  if (typeof payload === "object" && payload !== null && "command" in payload) {
    return typeof payload.command === "string" ? payload.command : null;
  }
  return null;
}

/** graphql-ws throws the socket's close event when the server refuses or drops the connection. */
function closed(event: unknown): ThreadloomError {
  if (typeof event === "object" && event !== null && "code" in event) {
    const reason = "reason" in event ? String(event.reason) : "";
    return new ThreadloomError(`WebSocket closed: ${String(event.code)} ${reason}`.trim());
  }
  return new ThreadloomError(`WebSocket failed: ${String(event)}`);
}
