"""Throw-away CAs and certificates (openssl) for the TLS tests."""
import os
import subprocess


def _openssl(directory, *args):
    subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)


def _make_ca(directory, name="ca"):
    _openssl(directory, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
             f"{name}.crt", "-days", "2", "-subj", f"/CN=test-{name}")


def _sign(directory, name, common_name, alt_names, ca="ca"):
    _openssl(directory, "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", f"/CN={common_name}")
    with open(os.path.join(directory, f"{name}.ext"), "w") as ext:
        ext.write(f"subjectAltName={alt_names}\n")
    _openssl(directory, "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext")


def make_certs(directory):
    """A CA with a server certificate (localhost, 127.0.0.1) and a client certificate."""
    _make_ca(directory)
    for name in ("server", "client"):
        _sign(directory, name, "client" if name == "client" else "localhost", "DNS:localhost,IP:127.0.0.1")
    return {name: os.path.join(directory, name) for name in
            ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")}


def make_host_certs(directory, ips, ca="ca"):
    """A CA `ca` and one certificate per host ip (its subjectAltName), as the hosts of an internal channel have:
    {ip: (certificate, key)}, and the CA's certificate under "ca"."""
    _make_ca(directory, ca)
    paths = {"ca": os.path.join(directory, f"{ca}.crt")}
    for ip in ips:
        name = f"{ca}-host-{ip}"
        _sign(directory, name, ip, f"IP:{ip}", ca)
        paths[ip] = (os.path.join(directory, f"{name}.crt"), os.path.join(directory, f"{name}.key"))
    return paths
