// The management API (api/...) as the page calls it: HTTP basic authentication with the
// credentials the user typed, kept in sessionStorage (this tab only, gone when it closes).

const STORAGE_KEY = "brokerd.dashboard.login";

/** A refusal or failure of the API: the HTTP status (0: no answer) and RabbitMQ's reason text. */
export class ApiError extends Error {
  constructor(status, reason) {
    super(reason);
    this.status = status;
    this.reason = reason;
  }
}

/** The Authorization header for a user and password (UTF-8, as the broker decodes it). */
export function basicAuthorization(user, password) {
  let binary = "";
  for (const byte of new TextEncoder().encode(`${user}:${password}`)) binary += String.fromCharCode(byte);
  return `Basic ${btoa(binary)}`;
}

/** An API path from its segments, each URL-encoded as RabbitMQ's clients do ("/" is %2F). */
export function apiPath(...segments) {
  return "api/" + segments.map((segment) => encodeURIComponent(segment)).join("/");
}

/** One API client logged in as one user. */
export class Api {
  constructor(user, authorization) {
    this.user = user;
    this.authorization = authorization;
  }

  async request(method, path, body) {
    // credentials "omit": the browser neither adds its own nor asks for a password on a 401;
    // the Authorization header is the page's own.
    const init = { method, headers: { Authorization: this.authorization }, credentials: "omit", cache: "no-store" };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(path, init);
    } catch (error) {
      throw new ApiError(0, `The broker did not answer (${error.message})`);
    }
    const text = await response.text();
    let data = null;
    try {
      data = text ? JSON.parse(text) : null;
    } catch {
      data = null;
    }
    if (!response.ok) {
      const reason = data && typeof data.reason === "string" && data.reason ? data.reason : `HTTP ${response.status}`;
      throw new ApiError(response.status, reason);
    }
    return data;
  }

  get(path) {
    return this.request("GET", path);
  }

  post(path, body) {
    return this.request("POST", path, body);
  }

  put(path, body) {
    return this.request("PUT", path, body);
  }

  delete(path) {
    return this.request("DELETE", path);
  }
}

/** Log in: the API client and /api/whoami's answer, or an ApiError with the broker's reason. */
export async function logIn(user, password) {
  const api = new Api(user, basicAuthorization(user, password));
  const whoami = await api.get(apiPath("whoami"));
  return { api, whoami };
}

export function saveLogin(api, whoami) {
  sessionStorage.setItem(STORAGE_KEY, JSON.stringify({ user: api.user, authorization: api.authorization, whoami }));
}

/** The login saved in this tab, as { api, whoami }, or null. */
export function savedLogin() {
  try {
    const saved = JSON.parse(sessionStorage.getItem(STORAGE_KEY));
    if (saved && typeof saved.user === "string" && typeof saved.authorization === "string") {
      return { api: new Api(saved.user, saved.authorization), whoami: saved.whoami || { name: saved.user, tags: [] } };
    }
  } catch {
    // nothing usable saved
  }
  return null;
}

export function forgetLogin() {
  sessionStorage.removeItem(STORAGE_KEY);
}
