// The login form: sends the key once as a header (never in a URL) and, once
// the gateway has set the login cookie, loads the dashboard.
const form = document.getElementById('login-form');
const error = document.getElementById('login-error');

form.addEventListener('submit', async (ev) => {
  ev.preventDefault();
  error.hidden = true;
  const key = document.getElementById('admin-key').value;
  try {
    const r = await fetch('/dashboard/login', {
      method: 'POST',
      headers: { 'x-kvgate-admin-key': key },
      credentials: 'same-origin',
    });
    if (r.ok) {
      location.replace('/dashboard');
      return;
    }
    error.textContent = r.status === 401 ? 'Wrong admin key.' : `Login failed (HTTP ${r.status}).`;
  } catch (e) {
    error.textContent = `Login failed: ${e.message}`;
  }
  error.hidden = false;
});
