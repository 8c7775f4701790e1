// The server's routes need this page's credential: headers for fetch, the
// query for sendBeacon, and what to say when it is missing or expired.
import { $ } from "./state.js";

// The credential this page got when its user logged in (vidchat/app/access.py);
// empty when the server asks for none.
export function pageToken() {
  const box = document.querySelector("#vidchat-page-token textarea, #vidchat-page-token input");
  return box ? box.value : "";
}

export function authHeaders(extra) {
  const token = pageToken();
  return { ...(extra || {}), ...(token ? { Authorization: `Bearer ${token}` } : {}) };
}

// sendBeacon cannot set headers: the token rides in the query (the server
// keeps it out of its access log).
export function beaconUrl(path) {
  const token = pageToken();
  return token ? `${path}?token=${encodeURIComponent(token)}` : path;
}

export function accessMode() {
  return $("#vc-live-access")?.dataset.mode || "none";
}

export function loginProblem(status) {
  if (status === 401 || status === 403) {
    return accessMode() === "hf"
      ? "Sign in with Hugging Face (top of the page) to start the camera."
      : "Your login is missing or has expired: reload the page and log in again.";
  }
  return "";
}
