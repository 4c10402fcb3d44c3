"""A throw-away CA with a server and a client certificate (openssl), for the TLS tests."""
import os
import subprocess


def make_certs(directory):
    def run(*args):
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
        "-subj", "/CN=test-ca")
    for name in ("server", "client"):
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
            "-subj", f"/CN={name}" if name == "client" else "/CN=localhost")
        with open(os.path.join(directory, f"{name}.ext"), "w") as ext:
            ext.write("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext")
    return {name: os.path.join(directory, name) for name in
            ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")}
